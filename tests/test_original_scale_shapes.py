"""--original against a checkpoint whose NVFP4 block scales (or global scale) do not fit the packed weight: the check
of the original must say so in one line (exit 2) or treat the module as one it cannot reproduce, never crash. Seen:
3-D experts with one expert's block scales fewer, a row or column short, an extra dim (IndexError, torch size errors
and tracebacks, exit 1, on trial and on the expert-by-expert check); an extra expert verified as if it fit."""

from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import run_captured
from tools.bench.experts3d import take_original_recipe, write_quantized_experts

NAME = "model.layers.0.mlp.experts.gate_up_proj"
BROKEN = {  # the stored block scales [E, in/16, out] = [4, 4, 96], or the global scale, as a broken export has them
    "scale fewer experts": ("_weight_scale", lambda s: s[:3]),
    "scale more experts": ("_weight_scale", lambda s: torch.cat([s, s[:1]])),
    "scale a row short": ("_weight_scale", lambda s: s[:, :-1]),
    "scale a column short": ("_weight_scale", lambda s: s[:, :, :-1]),
    "scale 2-D": ("_weight_scale", lambda s: s[0]),
    "scale 4-D": ("_weight_scale", lambda s: s[..., None]),
    "global scale a vector": ("_weight_scale_2", lambda s: s.reshape(1).repeat(2)),
}


@pytest.fixture(scope="module")
def experts(tmp_path_factory):
    base = tmp_path_factory.mktemp("experts")
    src = write_quantized_experts(base / "src", base / "original", 4, 64, 96)
    return src, base / "original", take_original_recipe(base / "take.toml")


@pytest.mark.parametrize("broken", list(BROKEN))
def test_block_scales_that_do_not_fit_are_refused_in_one_line_not_a_traceback(broken, experts, tmp_path, capsys):
    src, original, recipe = experts
    bad = tmp_path / "src"
    shutil.copytree(src, bad)
    tensors = load_file(str(bad / "model.safetensors"))
    suffix, change = BROKEN[broken]
    tensors[NAME + suffix] = change(tensors[NAME + suffix]).contiguous()
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    for flags in (["--recipe", recipe], ["--recipe", recipe, "--force"], ["--target", "bf16"]):
        out = tmp_path / "out"
        code, _, err = run_captured(capsys, "fix", bad, "-o", out, "--original", original, "--quiet", *flags)
        assert code in (0, 2) and "Traceback" not in err, f"{flags}: exit {code}: {err[-600:]}"
        if "--force" not in flags:  # its codes cannot be the original's: the only module does not reproduce
            assert code == 2 and err.count("\n") == 1 and not out.exists(), f"{flags}: exit {code}: {err}"
        shutil.rmtree(out, ignore_errors=True)
