"""Issue 26's four misread classes, each on tiny checkpoints laid out like real exports (tests/data/real/).

1. ModelOpt's raw `{"producer", "quantization"}` block as config.json's quantization_config (what its EAGLE-3
   exporter writes; vLLM 0.32's from_config reads its exclusions and KV-cache algorithm), alone or with
   hf_quant_config.json;
2. GLM-4.x MoE routers, which vLLM builds as GateLinear without a quant config, whatever the config lists;
3. compressed-tensors NVFP4A16 (`input_activations: null`) expects no activation scales, W4A4 does;
4. a fused layer (Qwen3 qkv_proj) with one BF16 shard is an error with vLLM's own failing check.
vLLM's side of each is checked in tests/vllm/test_config_forms_vs_vllm.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import load_tensors, run_captured
from tools.layout_fixture import real_json, write_layout
from tools.real_fixture import write_real_model

EAGLE, GLM = "modelopt-eagle3-draft", "modelopt-glm4-moe"
TARGET = "vllm==0.32.0"
DRAFT_EMBED_WARNING = ("warning", "unused-exclusion", "model.embed_tokens")


def inspect_modules(capsys, folder: Path) -> tuple[dict, dict]:
    code, out, err = run_captured(capsys, "inspect", "--json", folder)
    assert code == 0, err
    doc = json.loads(out)
    return doc["declaration"], {m["name"]: m["declared"] for m in doc["modules"]}


def doctor(capsys, folder: Path, *flags: str) -> tuple[int, list[dict]]:
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, "--json", *flags, folder)
    assert code in (0, 1), err
    return code, json.loads(out)["findings"]


def brief(findings: list[dict]) -> list[tuple[str, str, str]]:
    return [(f["severity"], f["code"], f["subject"]) for f in findings]


# --- 1. the nested {producer, quantization} form ---------------------------------------------------------------
@pytest.mark.parametrize("with_hf", [False, True], ids=["config.json alone", "both files"])
def test_nested_quantization_config_is_read_as_vllm_reads_it(tmp_path, capsys, with_hf):
    folder = write_layout(tmp_path / "draft", EAGLE, hf_quant=with_hf)
    declaration, declared = inspect_modules(capsys, folder)
    assert declaration["quant_algo"] == "NVFP4" and declaration["kv_cache"] == "FP8"
    assert declaration["config_json_ignore"] == ["lm_head", "model.embed_tokens"]
    assert declared["lm_head"] == "excluded"
    assert declared["layers.0.self_attn.q_proj"] == declared["fc"] == "quantized"
    # the exporter excludes the target's embed_tokens, which the draft does not store: a true warning, nothing else
    code, findings = doctor(capsys, folder)
    assert (code, brief(findings)) == (0, [DRAFT_EMBED_WARNING])


def test_packed_but_excluded_lm_head_is_an_error(tmp_path, capsys):
    folder = write_layout(tmp_path / "draft", EAGLE, change={"lm_head.weight": ("U8", (256, 32))})
    code, findings = doctor(capsys, folder)
    assert code == 1
    assert brief(findings) == [DRAFT_EMBED_WARNING, ("error", "config-contradiction", "lm_head")]


def test_fix_target_keeps_the_draft_and_its_kv_cache_scales(tmp_path, capsys):
    folder = write_layout(tmp_path / "draft", EAGLE)
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, "--json", "--quiet", "-o", tmp_path / "out", folder)
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "repair_report.json").read_text())
    # the one change: the exclusion of the unstored embed_tokens (doctor --strict's only warning) leaves the config;
    # nothing is dropped: the declared FP8 KV cache keeps its scales
    assert (json.loads(out)["status"], report["changes"], report["exclusions_removed"]) == ("written", [], ["model.embed_tokens"])
    assert {"layers.0.self_attn.k_proj.k_scale", "layers.0.self_attn.v_proj.v_scale"} <= set(load_tensors(tmp_path / "out"))
    assert doctor(capsys, tmp_path / "out", "--strict") == (0, [])


def test_nested_exclusions_are_rewritten_in_place(tmp_path, capsys):
    """fix writes its exclusions where vLLM reads them: inside the nested block, both files kept in agreement."""
    folder = write_layout(tmp_path / "draft", EAGLE, change={"lm_head.weight": ("U8", (256, 32))})
    code, _, err = run_captured(capsys, "fix", "--target", TARGET, "--quiet", "-o", tmp_path / "out", folder)
    assert code == 0, err
    config = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert set(config) == {"producer", "quantization"} and "lm_head" in config["quantization"]["exclude_modules"]
    tensors = load_tensors(tmp_path / "out")
    assert tensors["lm_head.weight"].dtype == torch.bfloat16
    assert {"layers.0.self_attn.k_proj.k_scale", "layers.0.self_attn.v_proj.v_scale"} <= set(tensors)
    code, findings = doctor(capsys, tmp_path / "out", "--strict")
    assert (code, brief(findings)) == (0, [])  # the unstored embed_tokens' exclusion went too: --target's promise


# --- 2. GLM-4.x MoE routers ------------------------------------------------------------------------------------
def glm_without_router_entries(folder: Path) -> Path:
    """ModelOpt's GLM-4.x MoE export with its exclusions naming no router (as exports that leave them out do)."""
    config, hf = real_json(GLM, "config.json"), real_json(GLM, "hf_quant_config.json")
    keep = [e for e in hf["quantization"]["exclude_modules"] if not e.endswith(".mlp.gate")]
    config["quantization_config"]["ignore"] = hf["quantization"]["exclude_modules"] = keep
    return write_layout(folder, GLM, config, hf)


def test_glm_routers_are_never_quantized(tmp_path, capsys):
    folder = glm_without_router_entries(tmp_path / "glm")
    _, declared = inspect_modules(capsys, folder)
    routers = [n for n in declared if n.endswith(".mlp.gate")]
    assert routers and all(declared[n] == "-" for n in routers)
    assert doctor(capsys, folder) == (0, [])
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, "--json", "--quiet", "-o", tmp_path / "out", folder)
    assert code == 0 and json.loads(out)["status"] == "noop", err


# --- 3. compressed-tensors NVFP4A16 vs W4A4 ----------------------------------------------------------------------
def ct_config(scheme: str) -> dict:
    """compressed-tensors' own preset scheme, as llm-compressor's NVFP4A16 / NVFP4 examples write it for a MoE."""
    from compressed_tensors.quantization import QuantizationConfig, QuantizationScheme
    from compressed_tensors.quantization.quant_scheme import preset_name_to_scheme

    group = QuantizationScheme(**{**preset_name_to_scheme(scheme, ["Linear"]).model_dump(), "format": "nvfp4-pack-quantized"})
    cfg = QuantizationConfig(config_groups={"group_0": group}, ignore=["lm_head", "re:.*mlp.gate$"], format="nvfp4-pack-quantized",
                             quantization_status="compressed")
    return json.loads(cfg.model_dump_json(exclude_none=False)) | {"quant_method": "compressed-tensors"}


@pytest.mark.parametrize("scheme,input_scales,errors", [("NVFP4A16", False, 0), ("NVFP4", True, 0), ("NVFP4", False, None)])
def test_compressed_tensors_scheme_decides_activation_scales(tmp_path, capsys, scheme, input_scales, errors):
    config = real_json(GLM, "config.json") | {"quantization_config": ct_config(scheme)}
    folder = write_layout(tmp_path / "ct", GLM, config, None, compressed_tensors=True,
                          drop=lambda n: n.endswith(("k_scale", "v_scale")) or (not input_scales and n.endswith("input_global_scale")))
    code, findings = doctor(capsys, folder)
    missing = [f for f in findings if f["code"] in ("missing-input-scale", "algorithm-mismatch")]
    if errors == 0:
        assert (code, findings) == (0, [])
    else:
        assert code == 1 and missing and all(f["severity"] == "error" for f in missing)


# --- 4. a fused layer with one BF16 shard ------------------------------------------------------------------------
def qwen3_with_bf16_shard(folder: Path, module: str = "model.layers.0.self_attn.k_proj") -> Path:
    from repair.codec import nvfp4

    write_real_model(folder, "qwen3-32b")
    tensors = load_file(folder / "model.safetensors")
    leaves = {leaf: tensors.pop(f"{module}.{leaf}") for leaf in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
    tensors[f"{module}.weight"] = nvfp4.dequantize(leaves["weight"], leaves["weight_scale"], leaves["weight_scale_2"]).to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_fused_layer_with_one_bf16_shard_is_an_error(tmp_path, capsys):
    folder = qwen3_with_bf16_shard(tmp_path / "qwen3")
    code, findings = doctor(capsys, folder)
    fused = [f for f in findings if f["code"] == "fused-shards"]
    assert code == 1 and [f["subject"] for f in fused] == ["model.layers.0.self_attn.qkv_proj"]
    assert fused[0]["runtime_error"] == "AssertionError: (no message) shape check in load_qkv_weight fails"
    out = tmp_path / "fixed"
    code, _, err = run_captured(capsys, "fix", "--target", TARGET, "--quiet", "-o", out, folder)
    assert code == 0, err
    assert doctor(capsys, out)[0] == 0


def test_healthy_qwen3_is_clean(tmp_path, capsys):
    assert doctor(capsys, write_real_model(tmp_path / "qwen3", "qwen3-32b")) == (0, [])


@pytest.mark.parametrize("inner", [None, "NVFP4", ["lm_head"], {"quant_algo": "NVFP4", "exclude_modules": "lm_head"},
                                   {"quant_algo": "NVFP4", "exclude_modules": [1]}])
def test_malformed_nested_block_is_one_line_exit_2(tmp_path, capsys, inner):
    config = real_json(EAGLE, "config.json")
    config["quantization_config"] = {"producer": {"name": "modelopt"}, "quantization": inner}
    folder = write_layout(tmp_path / "draft", EAGLE, config, None)
    for command in (("inspect",), ("doctor", "--target", TARGET)):
        code, out, err = run_captured(capsys, *command, folder)
        assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert "config.json" in err
