"""Cases of compressed-tensors configs with config groups of different schemes: layer prefix -> the algorithm it gets.

Shared by tests/test_ct_mixed_groups.py (doctor's reading) and the tiers, which ask vLLM 0.32's and SGLang 0.5.23's own
CompressedTensorsConfig the same prefixes (tools/ct_groups_probe.py). Each case: (groups, {prefix: algorithm or None},
packed_modules_mapping, ignore). The groups are the real RedHatAI DeepSeek-V4-Flash config's two schemes, re-targeted.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

REAL = Path(__file__).parent / "data" / "real" / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json"
_GROUPS = json.loads(REAL.read_text())["quantization_config"]["config_groups"]
FP8, NVFP4 = _GROUPS["group_0"], _GROUPS["group_1"]
W4A16 = {k: v for k, v in NVFP4.items() if k != "input_activations"}
DSV4_PACKED = {"fused_wqa_wkv": ["wq_a", "wkv"], "gate_up_proj": ["w1", "w3"]}  # vLLM 0.32 models/deepseek_v4
LLAMA_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _group(scheme: dict, *targets: str) -> dict:
    return {**copy.deepcopy(scheme), "targets": list(targets)}


CASES: dict[str, tuple[dict, dict[str, str | None], dict, list[str]]] = {
    "real-deepseek-v4": (copy.deepcopy(_GROUPS), {
        "layers.0.attn.fused_wqa_wkv": "FP8_BLOCK", "layers.0.attn.wq_b": "FP8_BLOCK", "layers.5.attn.wo_a": "FP8_BLOCK",
        "layers.42.attn.wo_b": "FP8_BLOCK", "layers.0.ffn.shared_experts.gate_up_proj": "NVFP4",
        "layers.0.ffn.shared_experts.down_proj": "NVFP4", "layers.0.attn.wq_a": None, "layers.0.ffn.gate": None,
        "head": None, "layers.0.attn.compressor.wkv": None, "mtp.0.e_proj": None}, DSV4_PACKED, []),
    "first-target-wins": ({"group_0": _group(FP8, "re:.*proj$"), "group_1": _group(NVFP4, "re:.*down_proj$")}, {
        "model.layers.0.mlp.down_proj": "FP8_BLOCK", "model.layers.0.self_attn.o_proj": "FP8_BLOCK"}, LLAMA_PACKED, []),
    "group-order-matters": ({"group_0": _group(NVFP4, "re:.*down_proj$"), "group_1": _group(FP8, "re:.*proj$")}, {
        "model.layers.0.mlp.down_proj": "NVFP4", "model.layers.0.self_attn.o_proj": "FP8_BLOCK"}, LLAMA_PACKED, []),
    "target-in-two-groups": ({"group_0": _group(FP8, "re:.*down_proj$", "re:.*o_proj$"),
                              "group_1": _group(NVFP4, "re:.*proj$", "re:.*down_proj$")}, {
        "model.layers.0.mlp.down_proj": "NVFP4", "model.layers.0.self_attn.o_proj": "FP8_BLOCK",
        "model.layers.0.self_attn.qkv_proj": "NVFP4"}, LLAMA_PACKED, []),
    "fused-by-its-shards": ({"group_0": _group(FP8, *(f"model.layers.0.self_attn.{s}_proj" for s in "qkv")),
                             "group_1": _group(NVFP4, "re:.*mlp.*")}, {
        "model.layers.0.self_attn.qkv_proj": "FP8_BLOCK", "model.layers.1.self_attn.qkv_proj": None,
        "model.layers.0.mlp.gate_up_proj": "NVFP4", "model.layers.0.self_attn.o_proj": None}, LLAMA_PACKED, []),
    "class-name-target": ({"group_0": _group(NVFP4, "Linear"), "group_1": _group(FP8, "re:.*o_proj$")}, {
        "model.layers.0.self_attn.o_proj": "FP8_BLOCK", "model.layers.0.mlp.down_proj": "NVFP4",
        "model.layers.0.self_attn.qkv_proj": "NVFP4", "model.layers.0.mlp.up_proj": None}, LLAMA_PACKED,
        ["re:.*up_proj$"]),
    "weight-only-nvfp4": ({"group_0": _group(W4A16, "re:.*mlp.*"), "group_1": _group(FP8, "re:.*self_attn.*")}, {
        "model.layers.0.mlp.down_proj": "W4A16_NVFP4", "model.layers.0.self_attn.o_proj": "FP8_BLOCK"}, LLAMA_PACKED, []),
}

# where the runtimes' pass orders differ (ct_groups.ORDERS): shards matched by group_0, every Linear by group_1
ORDER_CASE = ({"group_0": _group(FP8, *(f"model.layers.0.self_attn.{s}_proj" for s in "qkv")), "group_1": _group(NVFP4, "Linear")},
              "model.layers.0.self_attn.qkv_proj", {"vllm": "FP8_BLOCK", "sglang": "NVFP4"})


def case_config(name: str) -> dict:
    """The case's whole quantization_config: the real config's top level with the case's groups and ignore."""
    groups, _, _, ignore = CASES[name]
    return quantization_config(groups, ignore)


def quantization_config(groups: dict, ignore: list[str]) -> dict:
    qc = copy.deepcopy(json.loads(REAL.read_text())["quantization_config"])
    qc.update(config_groups=copy.deepcopy(groups), ignore=list(ignore))
    return qc
