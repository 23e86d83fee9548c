"""doctor's hints for a Qwen4Exp fused layer, run as they say, give outputs vLLM 0.32 loads. One shard stored BF16:
the hint says "dequantize every shard of it (fix --target does)", and fix --target vllm==0.32.0 dequantizes the packed
shards and, as vLLM also asks the unstored indexer shard of qkv_proj without QSA (quant_utils.py is_layer_skipped),
names the fused layer itself (tested first, quant_utils.py:662). Every stored shard listed: the hint says "name the
fused layer itself", and fix does that. tests/test_fix_hints.py runs the same commands without vLLM."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured

from .probe import requires_vllm
from .test_attack_qwen4exp import healthy, variant  # noqa: F401 (the module's fixture: the tier's healthy QSA export)
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def q_stored_bf16(folder: Path) -> Path:
    """The export without QSA, q/k/v NVFP4, then each q_proj stored BF16 (dequantized) and excluded by name."""
    tensors = load_file(folder / "model.safetensors")
    quant = json.loads((folder / "hf_quant_config.json").read_text())
    for name in sorted(n[: -len(".weight_scale_2")] for n in tensors if n.endswith("attn.q_proj.weight_scale_2")):
        parts = [tensors.pop(f"{name}.{leaf}") for leaf in ("weight", "weight_scale", "weight_scale_2")]
        tensors.pop(f"{name}.input_scale", None)
        tensors[f"{name}.weight"] = nvfp4.dequantize(*parts, torch.bfloat16)
        quant["quantization"]["exclude_modules"].append(name)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "hf_quant_config.json").write_text(json.dumps(quant, indent=1))
    return folder


def test_the_fused_shards_hint_is_what_fix_does_and_vllm_loads_it(healthy, tmp_path, capsys):  # noqa: F811
    src = q_stored_bf16(variant(healthy, tmp_path / "src", False, False, True))
    assert not in_vllm("vllm_load.py", src, "--moe-emulation")[0]["ok"]
    code, out, err = run_captured(capsys, "doctor", src, "--target", "vllm==0.32.0", "--json")
    assert any("(fix --target does)" in f["message"] for f in json.loads(out)["findings"] if f["code"] == "fused-shards")
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, err
    loaded = in_vllm("vllm_load.py", tmp_path / "out", "--moe-emulation")[0]
    assert loaded["ok"] and loaded["stand_in_calls"] == [], loaded


def test_every_shard_listed_fix_names_the_fused_layer_and_vllm_loads_it(healthy, tmp_path, capsys):  # noqa: F811
    """q/k/v stored BF16 and listed, the indexer shard vLLM asks not: vLLM refuses; doctor says "name the fused layer
    itself"; fix --target writes that entry (no module changes) and vLLM 0.32 loads the output."""
    src = variant(healthy, tmp_path / "src", False, False, False)
    assert not in_vllm("vllm_load.py", src, "--moe-emulation")[0]["ok"]
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, err
    loaded = in_vllm("vllm_load.py", tmp_path / "out", "--moe-emulation")[0]
    assert loaded["ok"] and loaded["stand_in_calls"] == [], loaded
