"""Qwen4Exp in SGLang 0.5.23, judged by its own loader (tools/sglang_probe.py) against doctor --target sglang==0.5.23.

SGLang registers Qwen4Exp only as its vision-language class (models/qwen4_exp.py:2694, `EntryClass =
[Qwen4ExpForConditionalGeneration]`, plus the MTP drafter). There, QSA attention keeps Qwen3.5's QKVParallelLinear
built with the full quant config (models/qwen3_5.py:1332-1341) and the indexer is a module of its own
(layers/attention/qsa/glue.py build_qsa_indexer): ModelOpt NVFP4 q/k/v load quantized, unlike vLLM 0.32, whose QSA
linear drops ModelOpt FP4 (qwen4_exp/nvidia/model.py:104). doctor reads no vLLM row for that class (vLLM's profile
covers text-generation classes), so it predicts what SGLang builds. `Qwen4ExpForCausalLM`, the name vLLM's text class
and transformers' export carry, SGLang does not register: get_model_architecture falls back to the Transformers
backend, which refuses it (model_loader/utils.py:181-186) before any layer is built; doctor reads that refusal from
the rules file's `transformers_backend` (SGLang's own gate, tools/sglang_backend.py) and says it in SGLang's words."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.test_doctor_load_refused import nvfp4
from tests.test_qwen4exp_without_qsa import INDEXER, INDEXER_NORMS, write

from .probe import TARGET, load_in_sglang, repair_json, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
REFUSAL = "Qwen4ExpForCausalLM has no SGlang implementation and the Transformers implementation is not compatible with SGLang."
ATTN = "model.language_model.layers.3.self_attn"
TEXT = {"model_type": "qwen4_exp_text", "hidden_size": 64, "num_hidden_layers": 4, "vocab_size": 256,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32, "num_experts": 4, "num_experts_per_tok": 2,
        "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
        "full_attention_interval": 4, "output_gate_type": "sigmoid",  # SGLang's Qwen3NextConfig reads the interval
        "layer_types": ["linear_attention"] * 3 + ["indexed_attention"], **INDEXER}
VISION = {"depth": 1, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2, "out_hidden_size": 64,
          "patch_size": 16, "spatial_merge_size": 2, "temporal_patch_size": 2, "num_position_embeddings": 64,
          "deepstack_visual_indexes": []}


def vlm(folder: Path) -> Path:
    """The QSA layer of a ModelOpt export of SGLang's class: q/k/v/o NVFP4 (a quantize-every-linear export, q/k/v
    under one weight_scale_2 as ModelOpt fuses them), the indexer BF16 and excluded, as a vision-language checkpoint."""
    folder.mkdir(parents=True)
    tensors = {"model.language_model.embed_tokens.weight": torch.zeros(256, 64, dtype=torch.bfloat16),
               f"{ATTN}.indexer.index_qk_proj.weight": torch.zeros(80, 64, dtype=torch.bfloat16),
               **{f"{ATTN}.indexer.{n}.weight": torch.ones(16, dtype=torch.bfloat16) for n in INDEXER_NORMS}}
    for module, rows in (("q_proj", 128), ("k_proj", 32), ("v_proj", 32), ("o_proj", 64)):
        tensors |= nvfp4(f"{ATTN}.{module}", rows, 64)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["Qwen4ExpForConditionalGeneration"], "model_type": "qwen4_exp", "text_config": TEXT,
              "vision_config": VISION, "image_token_id": 1, "video_token_id": 2, "vision_start_token_id": 3}
    (folder / "config.json").write_text(json.dumps(config))
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
             "exclude_modules": ["lm_head", f"{ATTN}.indexer.index_qk_proj", "model.visual*"]}
    (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.33.0"},
                                                             "quantization": quant}))
    return folder


def causal(folder: Path, qsa: bool) -> Path:
    """transformers' text class name (vLLM's text class) over the same text config, with or without QSA."""
    write(folder, INDEXER if qsa else {})
    config = {"architectures": ["Qwen4ExpForCausalLM"], **TEXT, **({} if qsa else dict.fromkeys(INDEXER))}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sglang_qwen4exp")
    return {"vlm": vlm(root / "vlm"), "causal-qsa": causal(root / "causal-qsa", True), "causal": causal(root / "causal", False)}


@pytest.fixture(scope="module")
def loaded(folders) -> dict[str, dict]:
    lines = load_in_sglang(list(folders.values()))
    return {name: lines[folder] for name, folder in folders.items()}


def test_sglang_builds_qsa_qkv_quantized_and_doctor_agrees(folders, loaded):
    line = loaded["vlm"]
    assert line["ok"] and line["architecture"] == "Qwen4ExpForConditionalGeneration", line
    qkv = line["layers"]["model.layers.3.qkv_proj"]
    assert qkv["method"] == "ModelOptFp4LinearMethod" and qkv["fused"] == ["q_proj", "k_proj", "v_proj"], qkv
    assert line["layers"]["model.layers.3.indexer.index_qk_proj"]["method"] == "UnquantizedLinearMethod"
    code, report = repair_json("doctor", folders["vlm"], "--target", TARGET)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert code == 0 and not errors and not report["runtime_stops_at"], errors


@pytest.mark.parametrize("name", ["causal-qsa", "causal"])
def test_sglang_builds_no_qwen4exp_for_causal_lm(folders, loaded, name):
    line = loaded[name]
    assert not line["ok"] and line["stage"] == "build" and line["error"] == REFUSAL, line
    code, report = repair_json("doctor", folders[name], "--target", TARGET, "--tp", "2")
    assert code == 1 and [s["error"] for s in report["runtime_stops_at"]] == [f"ValueError: {REFUSAL}"] * 2, report
