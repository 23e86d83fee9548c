"""SGLang 0.5.23's FusedMoE weight loader, expert by expert (#28): what doctor --target sglang==0.5.23 says is what
SGLang's own `FusedMoE._load_w13` / `_load_w2` do (layers/moe/fused_moe_triton/layer.py; the NVFP4 MoE loads through
narrow_padded_param_and_loaded_weight). Checked against SGLang itself in tests/sglang/test_routed_experts_vs_sglang.py:
- a BF16 expert in an MoE built NVFP4: gate_proj/up_proj (w13, rows narrowed, columns copied whole) stop the load
  with copy_'s RuntimeError; down_proj (w2, narrowed to the packed width) is cast into uint8 without an error;
- a packed expert in an MoE built BF16: gate_proj/up_proj stop the same way; down_proj is zero-padded silently;
- a fused layer's shard that is not stored (Qwen3 without k_proj) loads without an error: SGLang has no
  missing-weights check, so the k rows of qkv_proj keep uninitialised memory.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from safetensors.torch import load_file, save_file

from tests.test_runtime_sglang import SGLANG, doctor, errors
from tools.real_fixture import REAL_MODELS, write_real_model

MOE = "model.layers.10.mlp.experts"
W13 = "RuntimeError: The size of tensor a ({a}) must match the size of tensor b ({b}) at non-singleton dimension 1"


def deepseek(folder, bf16: str | None = None, exclude: str | None = None):
    model = REAL_MODELS["deepseek-v3-0324"]
    model = dataclasses.replace(model, bf16=model.bf16 + bf16) if bf16 else model
    write_real_model(folder, "deepseek-v3-0324", model)
    if exclude:
        hf = json.loads((folder / "hf_quant_config.json").read_text())
        hf["quantization"]["exclude_modules"].append(exclude)
        (folder / "hf_quant_config.json").write_text(json.dumps(hf))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-moe")
    return {"bf16-expert": deepseek(root / "bf16-expert", rf"|^{MOE.replace('.', '[.]')}[.]1[.]", f"{MOE}.1*"),
            "moe-excluded-packed": deepseek(root / "moe-excluded-packed", exclude=MOE)}


@pytest.mark.parametrize("tp", [1, 2])
def test_bf16_expert_in_an_nvfp4_moe_stops_on_gate_proj_and_casts_down_proj_silently(folders, capsys, tp):
    code, report = doctor(capsys, folders["bf16-expert"], SGLANG, "--tp", str(tp))
    stop = W13.format(a=32, b=64)  # H=64: the packed parameter holds 32 bytes a row, the BF16 row 64 values
    assert code == 1 and [(s["rank"], s["tensor"], s["error"]) for s in report["runtime_stops_at"]] == [
        (r, f"{MOE}.1.gate_proj.weight", stop) for r in range(tp)]
    found = errors(report)
    assert found[f"{MOE}.1.gate_proj"]["runtime_error"] == found[f"{MOE}.1.up_proj"]["runtime_error"] == stop
    down = found[f"{MOE}.1.down_proj"]
    assert down["code"] == "silent-garbage" and down["runtime_error"] is None and down["ranks"] == list(range(tp))
    assert down["message"].startswith("SGLang 0.5.23 casts this BF16 weight into its packed uint8 parameter")
    assert "moe loader refuses" not in json.dumps(report)


@pytest.mark.parametrize("tp", [1, 2])
def test_packed_experts_in_a_bf16_moe_stop_on_gate_proj_and_zero_pad_down_proj(folders, capsys, tp):
    code, report = doctor(capsys, folders["moe-excluded-packed"], SGLANG, "--tp", str(tp))
    stop = W13.format(a=64, b=32)
    assert code == 1 and [(s["rank"], s["tensor"], s["error"]) for s in report["runtime_stops_at"]] == [
        (r, f"{MOE}.0.gate_proj.weight", stop) for r in range(tp)]
    down = errors(report)[f"{MOE}.0.down_proj"]
    assert down["code"] == "silent-garbage" and down["runtime_error"] is None
    assert ("loads this as zeros on rank 1" if tp == 2 else "zero-pads this to [64, 32]") in down["message"]


def test_a_fused_layers_shard_not_stored_loads_silently_in_sglang(capsys, tmp_path):
    folder = write_real_model(tmp_path / "no-k", "qwen3-32b")
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.layers.0.self_attn.k_proj.")},
              folder / "model.safetensors", metadata={"format": "pt"})
    code, report = doctor(capsys, folder, SGLANG, "--tp", "2")
    found = errors(report)["model.layers.0.self_attn.k_proj"]
    assert code == 1 and found["code"] == "missing-module" and report["runtime_stops_at"] == []
    assert "SGLang 0.5.23 does not check for unfilled weights" in found["message"], found["message"]
    assert "not profiled" not in found["message"] and "refuses" not in found["message"]
