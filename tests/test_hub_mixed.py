"""A ModelOpt MIXED_PRECISION export (ModelOpt's own, tools/modelopt_mixed_export.py) read from the Hub
exactly as from a folder: the values doctor and planning read beyond the NVFP4 scales (NVFP4_AWQ's
pre_quant_scale, the KV cache's k_scale / v_scale) are fetched by range too. Before, the Hub mirror held
zeros there: `hub fix` refused every AWQ checkpoint ("pre_quant_scale: column 0 is 0.0") and doctor
reported healthy KV-cache scales as zero."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from safetensors.torch import load_file, save_file

from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    CARD, SRC, assert_equals_local_fix, full_gets, hub, hub_env, run,
)
from tests.test_shard_layout import stored, write_shard

TARGETS = ("bf16", "vllm==0.32.0", "vllm==0.25.0")


def without_label(report: str) -> dict:
    data = json.loads(report)
    data.pop("source", None)
    data["scale_checks"].pop("source")  # "disk" or "the Hub": where the scale bytes were read
    return data


VALUES = ("pre_quant_scale", "k_scale", "v_scale")  # values read beyond the NVFP4 / FP8 scales


def apart(src: Path) -> None:
    """Re-lay the shard so each of VALUES sits between two weights: with ranges merged only when they
    touch, its bytes are on the mirror only if they were asked for, not because a neighbouring
    scale's range happened to cover them."""
    shard = src / "model.safetensors"
    tensors, meta = stored(shard)
    values = [t for t in tensors if t[0].rpartition(".")[2] in VALUES]
    weights = [t for t in tensors if t[0].endswith(".weight")]
    rest = [t for t in tensors if t not in values and t not in weights]
    assert values and len(weights) > len(values)
    write_shard(shard, rest + [t for pair in zip(weights, values) for t in pair] + weights[len(values):], meta)


@pytest.mark.parametrize("kv", ["healthy", "zero-k-scale"])
def test_doctor_reads_a_hub_repo_as_it_reads_the_folder(hub, mixed_export, tmp_path, capsys, monkeypatch, kv):
    import repair.hub.source as source

    monkeypatch.setattr(source, "COALESCE_GAP", 0)
    src = tmp_path / "src"
    shutil.copytree(mixed_export, src)
    if kv == "zero-k-scale":
        shard = src / "model.safetensors"
        tensors = load_file(shard)
        name = next(n for n in tensors if n.endswith(".k_scale"))
        tensors[name] = torch.zeros_like(tensors[name])
        save_file(tensors, shard, metadata={"format": "pt"})
    apart(src)
    hub.add_repo(SRC, src)
    for target in TARGETS:
        remote = run(capsys, "doctor", SRC, "--target", target, "--json")
        local = run(capsys, "doctor", src, "--target", target, "--json")
        assert remote[0] == local[0] and without_label(remote[1]) == without_label(local[1]), target
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")], "doctor downloaded a shard"
    if kv == "zero-k-scale":
        assert "k_scale" in run(capsys, "doctor", SRC, "--target", "vllm==0.32.0")[1]


@pytest.mark.parametrize("target", ["bf16", "vllm==0.32.0"])  # 0.32: the AWQ layer vLLM cannot build is dequantized
def test_hub_fix_target_of_an_awq_export_equals_a_local_fix(hub, mixed_export, tmp_path, capsys, target):
    src = tmp_path / "src"
    shutil.copytree(mixed_export, src)
    apart(src)
    (src / "README.md").write_text(CARD)
    sha = hub.add_repo(SRC, src)
    local = tmp_path / "local"
    assert run(capsys, "fix", src, "-o", local, "--target", target, "--quiet")[0] == 0
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--target", target, "--quiet")
    assert code == 0, err
    assert_equals_local_fix(hub.repo_files("alice/fixed"), local, f"{SRC}@{sha}")


def test_an_fp8_scale_that_overflows_f16_is_refused_at_plan_time_as_locally(hub, tmp_path, capsys, monkeypatch):
    """A weight_scale large enough for FP8 codes to pass F16's range: planning reads the layer's codes to decide. On the
    Hub mirror they were zeros, so `hub fix --dry-run` printed a plan that the real run refused after creating the fork."""
    import repair.hub.source as source
    from tests.hub_workflow_helpers import commits
    from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed

    monkeypatch.setattr(source, "COALESCE_GAP", 0)  # the codes are on the mirror only if asked for
    tensors = tensors_for(healthy_layers())
    name = "model.layers.0.self_attn.o_proj"
    tensors[f"{name}.weight_scale"] = torch.tensor(1000.0)
    codes = tensors[f"{name}.weight"].view(torch.uint8).clone()
    codes[0, 0] = 0x7E  # 448, FP8's largest: 448 * 1000 > 65504
    tensors[f"{name}.weight"] = codes.view(torch.float8_e4m3fn)
    src = write_mixed(tmp_path / "src", tensors=tensors)
    recipe = tmp_path / "f16.toml"
    recipe.write_text(f'dtype = "f16"\n[[rules]]\naction = "dequantize"\nmodules = ["{name}"]\n')
    sha = hub.add_repo(SRC, src)
    local = run(capsys, "fix", src, "-o", tmp_path / "local", "--recipe", recipe, "--dry-run")
    assert local[0] == 2 and "makes dequantized values reach 4.48e+05" in local[2], local
    for args in (("--dry-run",), ()):
        code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--recipe", recipe, *args)
        assert (code, err.strip().splitlines()[-1].replace(f"{SRC}@{sha}", str(src))) == (2, local[2].strip()), err
    assert not commits(hub, "alice/fixed") and not HfApi(endpoint=hub.endpoint).repo_exists("alice/fixed")
