"""Attacks on the MIXED_PRECISION / FP8 / W4A16 reading (inspect and doctor), each found by hand first.

Checkpoints are tests/mixed_helpers.py's (ModelOpt's own converter writes config.json; tensors are real
layouts from repair.codec); each test breaks one thing a careless user or a hostile file could.
vLLM facts quoted are from vllm 0.32 model_executor/layers/quantization/modelopt.py and
model_loader/weight_utils.py get_quant_config (the vLLM tier checks the resolution order itself).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_captured
from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed

O_PROJ = "model.layers.0.self_attn.o_proj"


def doctor(capsys, folder, *args) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--strict", "--json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.mark.parametrize("scale", [None, torch.full((64, 1), 0.01), torch.full((1, 1), 0.01, dtype=torch.bfloat16)],
                         ids=["missing", "per-channel", "bf16"])
@pytest.mark.parametrize("target", [None, "bf16"])
def test_a_float8_weight_without_a_usable_per_tensor_scale_is_an_error(capsys, tmp_path, scale, target):
    """A float8 weight whose float32 scalar weight_scale is missing (or per-channel, or not float32) is no FP8 layer the
    tool reads: vLLM's per-tensor FP8 layer runs with an unloaded scale or fails its shape assert, and a BF16 runtime
    reads the float8 codes as values without their scale. It was a warning for a quantized target and nothing at
    all for an excluded layer or a bf16 target, so `fix` outputs that kept the bare float8 weight passed --strict."""
    tensors = tensors_for(healthy_layers())
    if scale is None:
        del tensors[f"{O_PROJ}.weight_scale"]
    else:
        tensors[f"{O_PROJ}.weight_scale"] = scale
    src = write_mixed(tmp_path / "x", tensors=tensors)
    code, report = doctor(capsys, src, *(["--target", target] if target else []))
    errors = [f for f in report["findings"] if f["subject"] == O_PROJ and f["severity"] == "error"]
    assert code == 1 and [f["code"] for f in errors] == ["fp8-scale"], [f for f in errors if f["code"] != "fp8-scale"]
    assert errors[0]["message"].startswith(f"{O_PROJ}: float8_e4m3 weight [64, 64] without a float32 per-tensor weight_scale")


def test_a_float8_weight_in_an_excluded_layer_is_an_error(capsys, tmp_path):
    """The output `fix` (vllm target) wrote for a missing FP8 scale: the layer excluded, its float8 weight kept."""
    layers = healthy_layers()
    tensors = tensors_for(layers)
    del tensors[f"{O_PROJ}.weight_scale"], tensors[f"{O_PROJ}.input_scale"]
    src = write_mixed(tmp_path / "x", {k: v for k, v in layers.items() if k != O_PROJ}, tensors=tensors)
    code, report = doctor(capsys, src)
    assert code == 1 and [f["code"] for f in report["findings"] if f["subject"] == O_PROJ and f["severity"] == "error"] == ["fp8-scale"]


def test_fused_shards_declared_with_different_algorithms_are_vllms_error(capsys, tmp_path):
    """q_proj FP8, k_proj NVFP4, v_proj FP8: vLLM resolves the fused qkv_proj and raises while building the model.
    doctor said 'no problems found'."""
    layers = healthy_layers()
    declared = dict(layers, **{"model.layers.0.self_attn.k_proj": "NVFP4"})
    src = write_mixed(tmp_path / "x", declared, tensors=tensors_for(declared))
    code, report = doctor(capsys, src)
    fused = [f for f in report["findings"] if f["code"] == "fused-shards"]
    assert code == 1 and len(fused) == 1 and fused[0]["severity"] == "error"
    assert fused[0]["subject"] == "model.layers.0.self_attn.qkv_proj"
    assert fused[0]["runtime_error"] == ("ValueError: Mixed quant_algo within fused layer model.layers.0.self_attn.qkv_proj: "
                                         "{'FP8', 'NVFP4'}. All shards must use the same quantization.")
    assert "q_proj, k_proj and v_proj" in fused[0]["message"] and "FP8" in fused[0]["message"]


def test_config_json_without_quantized_layers_falls_back_to_hf_quant_config(capsys, tmp_path):
    """vLLM 0.32 get_quant_config: for modelopt_mixed, a config.json quantization_config without `quantized_layers`
    (older exports) falls through to hf_quant_config.json, whose map, exclude_modules and kv_cache_quant_algo it
    then reads. The tool refused such a checkpoint even for inspect."""
    layers = {k: "NVFP4" if v == "NVFP4_AWQ" else v for k, v in healthy_layers().items()}  # vLLM 0.32 has no NVFP4_AWQ
    src = write_mixed(tmp_path / "x", layers, exclude=["lm_head"])
    edit_json(src / "config.json", lambda c: [c["quantization_config"].pop(k) for k in ("quantized_layers", "config_groups", "ignore")])
    code, out, err = run_captured(capsys, "inspect", src, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["declaration"]["quantized_layers"] == layers
    code, report = doctor(capsys, src)
    assert (code, report["findings"]) == (0, [])


def test_config_json_with_an_empty_quantized_layers_is_still_refused(capsys, tmp_path):
    """The key present but empty: vLLM reads config.json and refuses it (no fallback)."""
    src = write_mixed(tmp_path / "x")
    edit_json(src / "config.json", lambda c: c["quantization_config"].update(quantized_layers={}))
    code, _, err = run_captured(capsys, "inspect", src)
    assert code == 2 and "without a non-empty quantized_layers map" in err and err.count("\n") == 1


def test_an_excluded_fp8_layer_is_not_called_packed_nvfp4(capsys, tmp_path):
    src = write_mixed(tmp_path / "x")
    edit_json(src / "config.json", lambda c: c["quantization_config"].update(ignore=[O_PROJ]))
    edit_json(src / "hf_quant_config.json", lambda c: c["quantization"].update(exclude_modules=[O_PROJ]))
    code, report = doctor(capsys, src)
    contradiction = [f for f in report["findings"] if f["subject"] == O_PROJ and f["code"] == "config-contradiction"]
    assert code == 1 and len(contradiction) == 1
    message = contradiction[0]["message"]  # an error now: vLLM builds the excluded layer unquantized and cannot load it
    assert message.startswith(f"{O_PROJ}: stored FP8, but the config excludes it") and "NVFP4" not in message


@pytest.mark.parametrize("scheme", ["drop", "fp8", {"type": "int", "num_bits": 8}], ids=["absent", "string", "int"])
def test_kv_cache_is_declared_only_where_vllm_reads_it(capsys, tmp_path, scheme):
    """config.json has a quantization_config, so vLLM reads its kv_cache_scheme object only: absent (hf_quant_config.json
    still says FP8), a string, or not float/8 bits gives no FP8 KV cache, and the stored k/v scales are not used as
    such. doctor claimed an FP8 KV cache (and inspect showed one) in all three cases."""
    src = write_mixed(tmp_path / "x")
    edit_json(src / "config.json", lambda c: c["quantization_config"].pop("kv_cache_scheme") if scheme == "drop"
              else c["quantization_config"].update(kv_cache_scheme=scheme))
    code, out, _ = run_captured(capsys, "inspect", src, "--json")
    assert code == 0 and json.loads(out)["declaration"]["kv_cache"] in (None, "INT")
    code, report = doctor(capsys, src)
    if scheme == "drop" or isinstance(scheme, str):
        kv = [f for f in report["findings"] if f["code"] == "kv-cache-scales"]
        assert code == 1 and len(kv) == 1 and "config.json quantization_config.kv_cache_scheme" in kv[0]["message"]


def _mixed_moe(folder: Path, first: str) -> Path:
    """The Qwen3-30B-A3B real-config fixture declared MIXED_PRECISION, every stored NVFP4 module NVFP4 in
    quantized_layers (per expert, as ModelOpt lists them), except layer 0's expert 0 gate_proj (first key): `first`."""
    from safetensors import safe_open

    from tests.mixed_helpers import quantization_config
    from tools.real_fixture import write_real_model

    src = write_real_model(folder, "qwen3-30b-a3b")
    with safe_open(src / "model.safetensors", "pt") as f:
        modules = sorted({k.rsplit(".", 1)[0] for k in f.keys() if k.endswith(".weight_scale_2")})
    key = "model.layers.0.mlp.experts.0.gate_proj"
    layers = {key: {"quant_algo": first, "group_size": 16}}
    layers.update({m: {"quant_algo": "NVFP4", "group_size": 16} for m in modules if m != key})
    hf = json.loads((src / "hf_quant_config.json").read_text())
    hf["quantization"].update(quant_algo="MIXED_PRECISION", quantized_layers=layers)
    hf["quantization"].pop("group_size", None)
    (src / "hf_quant_config.json").write_text(json.dumps(hf))
    edit_json(src / "config.json", lambda c: c.update(quantization_config=quantization_config(hf)))
    return src


def test_an_expert_resolved_through_its_moe_layers_first_key_says_so(capsys, tmp_path):
    """vLLM resolves the routed-experts layer `model.layers.0.mlp.experts` from the first key under it (step 3 of
    _resolve_quant_algo), so every expert of layer 0 is built W4A16_NVFP4 although experts 1-3 are listed NVFP4.
    doctor said 'experts.1.gate_proj: declared W4A16_NVFP4', which its own entry contradicts."""
    src = _mixed_moe(tmp_path / "moe", "W4A16_NVFP4")
    code, report = doctor(capsys, src)
    by = {f["subject"]: f for f in report["findings"] if f["code"] == "algorithm-mismatch"}
    assert code == 1 and {s.split(".mlp.")[0] for s in by} == {"model.layers.0"}
    assert by["model.layers.0.mlp.experts.1.gate_proj"]["message"].startswith(
        "model.layers.0.mlp.experts.1.gate_proj: declared W4A16_NVFP4 for the routed-experts layer model.layers.0.mlp.experts "
        "(vLLM builds every expert of it from the first quantized_layers key under it; this expert's own entry says NVFP4) "
        "but its tensors are NVFP4")
    # expert 0's own entry is W4A16_NVFP4: its stored input_scale is dropped by vLLM, one note for all such layers
    assert "model.layers.0.mlp.experts.0.gate_proj" not in by
    assert report["notes"][0]["message"].startswith("1 layer(s) declared W4A16_NVFP4 store an input_scale (model.layers.0.mlp.experts.0.gate_proj, ...)")


@pytest.mark.parametrize("value", [float("nan"), 0.0, -0.05, [0.05, 0.05]], ids=["nan", "zero", "negative", "two"])
def test_a_declared_kv_cache_scale_must_be_a_positive_float32_scalar(capsys, tmp_path, value):
    """vLLM scales every cached key/value by k_scale / v_scale under an FP8 KV cache; doctor only checked that they exist."""
    layers = {k: "NVFP4" if v == "NVFP4_AWQ" else v for k, v in healthy_layers().items()}
    tensors = tensors_for(layers)
    tensors["model.layers.1.self_attn.v_proj.v_scale"] = torch.tensor(value)
    code, report = doctor(capsys, write_mixed(tmp_path / "x", layers, tensors=tensors))
    assert code == 1 and [(f["severity"], f["code"], f["subject"]) for f in report["findings"]] == [
        ("error", "kv-cache-scales", "model.layers.1.self_attn.v_proj.v_scale")]


def test_a_3d_float8_weight_is_not_said_to_lack_the_scale_it_has(capsys, tmp_path):
    """Fused routed experts stored as one [experts, out, in] float8 weight with a float32 scalar scale: the tool reads
    2-D FP8 weights only, and must say that, not 'without a float32 per-tensor weight_scale (it has F32 [])'."""
    layers = {k: "NVFP4" if v == "NVFP4_AWQ" else v for k, v in healthy_layers().items()}
    tensors = tensors_for(layers)
    tensors["model.layers.1.mlp.experts.weight"] = torch.zeros(4, 64, 64).to(torch.float8_e4m3fn)
    tensors["model.layers.1.mlp.experts.weight_scale"] = torch.tensor(1.0)
    code, report = doctor(capsys, write_mixed(tmp_path / "x", dict(layers, **{"model.layers.1.mlp.experts": "FP8"}), tensors=tensors))
    finding = next(f for f in report["findings"] if f["subject"] == "model.layers.1.mlp.experts")
    assert (finding["severity"], finding["code"]) == ("warning", "fp8-scale")
    assert finding["message"].startswith("model.layers.1.mlp.experts: float8_e4m3 weight [4, 64, 64] is 3-D; this tool reads")


def test_activation_scales_are_checked_without_a_loader_profile(capsys, tmp_path):
    """LlamaForCausalLM has no loader profile, so doctor had no per-layer precision and skipped every activation-scale
    check: an FP8 or NVFP4 layer without input_scale, or with a NaN one, passed. vLLM 0.32's loader reports the
    missing ones ("Following weights were not initialized from checkpoint: {...input_scale, ...}") or runs with them."""
    layers = {k: "NVFP4" if v in ("W4A16_NVFP4", "NVFP4_AWQ") else v for k, v in healthy_layers().items()}
    tensors = tensors_for(layers)
    del tensors[f"{O_PROJ}.input_scale"], tensors["model.layers.0.mlp.down_proj.input_scale"]
    tensors["model.layers.1.mlp.down_proj.input_scale"] = torch.tensor(float("nan"))
    code, report = doctor(capsys, write_mixed(tmp_path / "x", layers, tensors=tensors))
    assert code == 1 and sorted((f["code"], f["subject"]) for f in report["findings"] if f["severity"] == "error") == [
        ("algorithm-mismatch", "model.layers.0.mlp.down_proj"), ("input-scale", "model.layers.1.mlp.down_proj.input_scale"),
        ("missing-input-scale", O_PROJ)]
