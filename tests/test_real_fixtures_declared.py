"""Real-config fixtures read as vLLM 0.32 reads them (issue 18): healthy ones pass `doctor --strict` with no
finding, layer roles vLLM never quantizes are not "declared quantized", and a config whose fused-layer shards
disagree is predicted to stop vLLM with its own error.

Fixtures: tools/real_fixture.py (published quantization configs and tensor-name patterns, tiny sizes), built
once per session. The states asserted here are the ones vLLM's own classes decide (tests/vllm/
test_declared_vs_vllm.py compares every module with them).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools.real_fixture import REAL_MODELS

from tests.conftest import run_captured

TARGET = "vllm==0.32.0"
REFUSED = "deepseek-r1"  # kv_a_proj_with_mqa excluded, q_a_proj not: vLLM refuses fused_qkv_a_proj
HEALTHY = [k for k in REAL_MODELS if k != REFUSED]

# module -> declared state, as vLLM 0.32 builds it ("-": a role vLLM never quantizes)
EXPECTED = {
    "llama-3.3-70b": {"model.embed_tokens": "-", "lm_head": "excluded", "model.layers.0.self_attn.q_proj": "quantized"},
    "qwen3-30b-a3b": {"model.embed_tokens": "-", "model.layers.0.mlp.gate": "excluded",  # built with the quant config
                      "model.layers.47.mlp.experts.3.down_proj": "quantized"},
    "deepseek-v3-0324": {"model.embed_tokens": "-", "model.layers.3.mlp.gate": "-",  # GateLinear(quant_config=None)
                         "model.layers.61.eh_proj": "-", "model.layers.61.embed_tokens": "-",  # MTP: nn.Linear, embedding
                         "model.layers.61.mlp.experts.0.gate_proj": "excluded", "model.layers.3.mlp.experts.1.up_proj": "quantized",
                         "model.layers.0.self_attn.q_a_proj": "excluded"},
    "gemma-4-31b-it": {"model.language_model.embed_tokens": "-", "model.language_model.layers.0.self_attn.q_proj": "excluded",
                       "model.language_model.layers.1.mlp.gate_proj": "quantized",
                       # vLLM 0.32 builds the vision tower unquantized under ModelOpt NVFP4 (its generated row)
                       "model.vision_tower.encoder.layers.0.mlp.up_proj.linear": "-"},
    "ct-laguna-moe": {"model.embed_tokens": "-", "lm_head": "-", "model.layers.1.mlp.gate": "-",
                      "model.layers.1.mlp.experts.0.gate_proj": "quantized", "model.layers.0.self_attn.g_proj": "excluded"},
    "qwen3-32b": {"model.embed_tokens": "-", "lm_head": "excluded", "model.layers.1.self_attn.k_proj": "quantized"},
    "ct-llama-dense": {"model.embed_tokens": "-", "lm_head": "-", "model.layers.0.mlp.up_proj": "quantized",
                       "model.layers.1.self_attn.v_proj": "excluded"},
}


def inspected(capsys, folder: Path) -> dict[str, str]:
    code, out, err = run_captured(capsys, "inspect", "--json", folder)
    assert code == 0, err
    return {m["name"]: m["declared"] for m in json.loads(out)["modules"]}


def doctor(capsys, folder: Path) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, "--strict", "--json", folder)
    assert err == "" or code != 2, err
    return code, json.loads(out)


# key -> the one finding vLLM 0.32 has with a correct export: its model code, not the checkpoint (tests/test_doctor_dropped.py)
RUNTIME_DEFECT = {"ct-laguna-moe": ("dropped-tensor", "model.layers.1.mlp.experts.e_score_correction_bias")}


@pytest.mark.parametrize("key", HEALTHY)
def test_healthy_real_fixture_passes_strict_doctor(real_models, capsys, key):
    code, report = doctor(capsys, real_models[key])
    found = [(f["code"], f["subject"]) for f in report["findings"]]
    if key in RUNTIME_DEFECT:  # laguna.py drops the routed experts' correction bias from every checkpoint
        assert (code, found) == (1, [RUNTIME_DEFECT[key]]), report["findings"]
        return
    assert [f["message"] for f in report["findings"]] == []
    assert code == 0


@pytest.mark.parametrize("key", HEALTHY)
def test_declared_states_are_vllms(real_models, capsys, key):
    declared = inspected(capsys, real_models[key])
    assert {name: declared.get(name) for name in EXPECTED[key]} == EXPECTED[key]
    never = [n for n, d in declared.items() if d == "quantized" and (n.endswith("embed_tokens") or n.endswith("norm"))]
    assert never == []


def test_deepseek_r1_fused_shards_predicted_as_vllms_refusal(real_models, capsys):
    code, report = doctor(capsys, real_models[REFUSED])
    assert code == 1
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert {f["code"] for f in errors} == {"fused-shards"}
    assert {f["subject"] for f in errors} == {f"model.layers.{n}.self_attn.fused_qkv_a_proj" for n in range(61)}
    first = next(f for f in errors if f["subject"] == "model.layers.0.self_attn.fused_qkv_a_proj")
    assert first["runtime_error"] == ("Detected some but not all shards of model.layers.0.self_attn.fused_qkv_a_proj are "
                                      "quantized. All shards of fused layers to have the same precision.")
    assert "q_a_proj" in first["message"] and "kv_a_proj_with_mqa" in first["message"]
    # the rest is true of the published config: it excludes q_proj, which an MLA model with q_lora_rank has not
    warnings = [f for f in report["findings"] if f["severity"] == "warning"]
    assert {f["code"] for f in warnings} == {"unused-exclusion"}
    assert all(f["subject"].endswith(".self_attn.q_proj") for f in warnings)


def with_ignore(src: Path, dst: Path, extra: list[str]) -> Path:
    """A copy of a compressed-tensors fixture whose `ignore` list has `extra` appended."""
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    config["quantization_config"]["ignore"] += extra
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


def test_compressed_tensors_exact_embedding_entry_counts_as_used(real_models, capsys, tmp_path):
    folder = with_ignore(real_models["ct-llama-dense"], tmp_path / "ct", ["model.embed_tokens"])
    code, report = doctor(capsys, folder)
    assert [f["message"] for f in report["findings"]] == []
    assert code == 0


def test_compressed_tensors_fused_shards_predicted(real_models, capsys, tmp_path):
    """One shard of gate_up_proj ignored by exact name: compressed-tensors' should_ignore_layer refuses it."""
    folder = with_ignore(real_models["ct-llama-dense"], tmp_path / "ct", ["model.layers.1.mlp.up_proj"])
    code, report = doctor(capsys, folder)
    fused = [f for f in report["findings"] if f["code"] == "fused-shards"]
    assert code == 1
    assert [(f["subject"], f["runtime_error"]) for f in fused] == [
        ("model.layers.1.mlp.gate_up_proj", "Found different quantization schemes for the shards of "
                                            "model.layers.1.mlp.gate_up_proj. vLLM requires all to use the same scheme.")]
