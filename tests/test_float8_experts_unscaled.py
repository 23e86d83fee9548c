"""Float8 3-D experts stored with no `.weight` leaf and no scale (transformers' `mlp.experts.gate_up_proj` layout of
gpt-oss, Llama4, GraniteMoeSWA), in a MoE layer the config excludes: vLLM builds that FusedMoE unquantized (BF16) and
copies the float8 codes into it as values, with no scale and no error: meaningless weights. doctor said nothing (the
float8 check read `X.weight` tensors only); it is an error naming the tensors and what to do, and fix refuses in one
line (exit 2), saying it cannot take them from --original (no recipe rule selects a leafless tensor). vLLM's own load: tests/vllm/test_float8_experts_vs_vllm.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import EXPERTS, TARGET, export

LEAVES = ("gate_up_proj", "down_proj")


def float8_experts(root: Path, arch: str, scaled: str = "", excluded: bool = True) -> Path:
    """A ModelOpt NVFP4 export whose layers' 3-D experts are float8_e4m3 with no leaf, with (or without) a scale beside."""
    model_type, block = EXPERTS[arch]
    gen = torch.Generator().manual_seed(1)
    experts = {f"model.layers.{n}.{block}.experts.{p}": (torch.randn(4, 64, 32, generator=gen) * 0.1).to(torch.float8_e4m3fn)
               for n in range(2) for p in LEAVES}
    if scaled:
        experts |= {f"{name}{scaled}": torch.ones(4, dtype=torch.float32) for name in list(experts)}
    layers = [f"model.layers.{n}.{block}.experts" for n in range(2)]
    return export(root, arch, model_type, experts, ["lm_head", *layers] if excluded else ["lm_head"])


@pytest.mark.parametrize("arch", sorted(EXPERTS))
def test_doctor_names_unscaled_float8_experts_in_an_excluded_layer(arch, tmp_path, capsys):
    src = float8_experts(tmp_path / "src", arch)
    code, out, _ = run_captured(capsys, "doctor", src, "--target", TARGET, "--json")
    found = [f for f in json.loads(out)["findings"] if f["code"] == "unscaled-float8"]
    block = EXPERTS[arch][1]
    assert code == 1 and {f["subject"] for f in found} == {f"model.layers.{n}.{block}.experts.{p}" for n in range(2) for p in LEAVES}, found
    assert all(f["severity"] == "error" and "no scale" in f["message"] and "BF16" in f["message"] for f in found), found
    assert all("re-export" in f["message"] and "fix does neither" in f["message"] for f in found), found


@pytest.mark.parametrize("scale", ["_weight_scale", "_scale", "_scale_inv", ".weight_scale_inv", "_weight_scale_2"])
def test_a_scale_beside_them_is_not_this_error(scale, tmp_path, capsys):
    """A float8 expert tensor with any scale beside it is another layout (FP8 MoE: transformers' FP8Expert names it
    `gate_up_proj_scale_inv`, block FP8 `..._scale_inv`), not float8 codes without a scale."""
    src = float8_experts(tmp_path / "src", "GptOssForCausalLM", scaled=scale)
    out = run_captured(capsys, "doctor", src, "--target", TARGET, "--json")[1]
    assert not [f for f in json.loads(out)["findings"] if f["code"] == "unscaled-float8"], out


@pytest.mark.parametrize("dry_run", [True, False])
def test_fix_refuses_in_one_line_and_writes_nothing(dry_run, tmp_path, capsys):
    src = float8_experts(tmp_path / "src", "GptOssForCausalLM")
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", TARGET, *(["--dry-run"] if dry_run else []))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, out + err
    assert "model.layers.0.mlp.experts.down_proj" in err and "nothing was written" in err, err
    assert "--original to take" not in err and "fix does neither" in err, err  # the advice is true for this case
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
