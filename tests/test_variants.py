"""A row's facts that depend on one config field (the profile's `variants`, build_refused's `unless`): the conditions as
doctor reads them from a hostile config.json, and the shipped data against its generator's table
(tools/vllm_variants.py). vLLM's own loader judges DeepSeek-V2-Lite's build in tests/vllm/test_variants_vs_vllm.py."""

from __future__ import annotations

import pytest

from repair import arch
from repair.arch.variants import holds, varied
from tools.vllm_variants import QUANT_METHOD, QUANT_VARIANTS, VARIANTS, condition, respellings

NULL = {"field": "q_lora_rank", "is": None}
OTHER = {"field": "num_experts", "other_than": 0}
DOTTED = {"field": "quantization_config.kv_cache_scheme", "is": {"num_bits": 8, "type": "float"}}
WIDE = {"field": "kv_cache_scheme", "includes": {"dynamic": False, "num_bits": 8, "type": "float"}}


@pytest.mark.parametrize("cond, config, want", [
    (NULL, {"q_lora_rank": None}, True),
    (NULL, {}, False),  # absent: transformers' DeepseekV2Config default (1536), the fused build
    (NULL, {"q_lora_rank": 0}, False),
    (NULL, {"text_config": {"q_lora_rank": None}}, True),  # a VLM's text part
    (NULL, {"text_config": "x", "q_lora_rank": None}, True),  # a text_config that is no dict: the config itself
    (OTHER, {"num_experts": 8}, True),
    (OTHER, {"num_experts": 0}, False),
    (OTHER, {}, False),  # vLLM reads getattr(config, "num_experts", 0): the row's own build
    (OTHER, {"num_experts": True}, False),  # a bool is no int here
    (OTHER, {"num_experts": 8.0}, False),
    (OTHER, {"num_experts": "8"}, False),
    (DOTTED, {"quantization_config": {"kv_cache_scheme": {"type": "float", "num_bits": 8}}}, True),
    (DOTTED, {"quantization_config": {"kv_cache_scheme": {"type": "float", "num_bits": 8.0}}}, False),
    (DOTTED, {"quantization_config": {"kv_cache_scheme": {"type": "float", "num_bits": True}}}, False),
    (DOTTED, {"quantization_config": ["kv_cache_scheme"]}, False),
    (DOTTED, {"kv_cache_scheme": {"type": "float", "num_bits": 8}}, False),
    ({"field": 3, "is": None}, {3: None}, False),
    ({"field": "q_lora_rank"}, {"q_lora_rank": None}, False),
    (dict(NULL, **{"with": [OTHER]}), {"q_lora_rank": None, "num_experts": 2}, True),  # each `with` holds too
    (dict(NULL, **{"with": [OTHER]}), {"q_lora_rank": None}, False),
    (dict(NULL, **{"with": OTHER}), {"q_lora_rank": None, "num_experts": 2}, False),  # malformed: no list
    (dict(NULL, **{"with": [dict(OTHER, **{"with": "x"})]}), {"q_lora_rank": None, "num_experts": 2}, False),
    ("q_lora_rank", {"q_lora_rank": None}, False),
    # as wide as a release reads (vLLM 0.28's get_kv_cache_quant_algo_string: `num_bits == 8`, other keys unread,
    # `dynamic is False`, the algo lowered, a quant_method starting with "modelopt")
    (WIDE, {"kv_cache_scheme": {"dynamic": False, "num_bits": 8.0, "type": "float", "x": 1}}, True),
    (WIDE, {"kv_cache_scheme": {"dynamic": False, "num_bits": 8, "type": "float"}}, True),
    (WIDE, {"kv_cache_scheme": {"dynamic": 0, "num_bits": 8, "type": "float"}}, False),
    (WIDE, {"kv_cache_scheme": {"dynamic": False, "num_bits": True, "type": "float"}}, False),
    (WIDE, {"kv_cache_scheme": {"dynamic": False, "num_bits": "8", "type": "float"}}, False),
    (WIDE, {"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, False),
    (WIDE, {"kv_cache_scheme": "fp8"}, False),
    ({"field": "a", "any_case": "FP8"}, {"a": "fP8"}, True),
    ({"field": "a", "any_case": "FP8"}, {"a": "fp8 "}, False),
    ({"field": "a", "any_case": "FP8"}, {"a": 8}, False),
    ({"field": "a", "any_case": 8}, {"a": "8"}, False),
    ({"field": "a", "starts_with": "modelopt"}, {"a": "modelopt_fp4"}, True),
    ({"field": "a", "starts_with": "modelopt"}, {"a": "Modelopt"}, False),
    (NULL, None, False),
    (NULL, [], False),
])
def test_a_condition_holds_only_for_the_value_recorded(cond, config, want):
    assert holds(cond, config) is want


def test_a_variant_overlays_its_build_and_nothing_else():
    entry = {"config": {"source": "s", "agrees_with": {"num_experts": 0, "other": 1}}, "modules": {"a": {}}, "fused": {},
             "renames": {"x": "y"}, "variants": [dict(OTHER, modules={"b": {}}, fused={"g": ["h"]})]}
    assert varied(entry, {"num_experts": 0}) is entry
    got = varied(entry, {"num_experts": 2})
    assert got["modules"] == {"b": {}} and got["fused"] == {"g": ["h"]} and got["renames"] == {"x": "y"}
    assert got["config"]["agrees_with"] == {"other": 1} and "variants" in got["config"]["source"]
    assert varied({"variants": "hostile"}, {}) == {"variants": "hostile"}
    drafted = dict(entry, mtp={"modules": {"d": {}}}, variants=[dict(OTHER, modules={}, fused={}, mtp={"modules": {"e": {}}})])
    assert varied(drafted, {"num_experts": 2})["mtp"] == {"modules": {"e": {}}}  # its drafter built again too
    assert varied(dict(drafted, variants=entry["variants"]), {"num_experts": 2})["mtp"] == {"modules": {"d": {}}}


def widened(rule: dict) -> dict:
    return {"field": rule["field"], respellings(rule["is"])[0]: rule["is"]}


def test_every_shipped_variant_is_its_generators_and_differs_from_its_row():
    """Each `variants` entry is one of VARIANTS' conditions for that architecture, with the modules and fused layers of
    the other build, which differ from the row's (and what its load_weights raises on: `weight_refused`, MiniCPMMoE's
    NVFP4 expert scales); each `unless` is one of QUANT_VARIANTS' with what the build did."""
    seen = set()
    for profile in arch.PROFILES:
        for name, entry in profile.entries.items():
            for variant in entry.get("variants", ()):
                assert {k: v for k, v in variant.items() if k not in ("modules", "fused", "mtp", "weight_refused")} in \
                    [condition(r) for r in VARIANTS.get(name, ())], (profile.label, name)
                assert (variant["modules"], variant["fused"]) != (entry["modules"], entry["fused"])
                seen.add(name)
        for name, fact in profile.build_refused.items():
            for u in fact.get("unless", ()):  # as recorded, or as wide as the release's reading (read_alike)
                assert any({k: v for k, v in u.items() if k not in ("then", "with")} in (r, widened(r))
                           for r in QUANT_VARIANTS) and u["then"], (profile.label, name)
                assert u["with"][0] in (QUANT_METHOD, widened(QUANT_METHOD)), (profile.label, name)
    assert seen == set(VARIANTS)


@pytest.mark.parametrize("release", [(0, 28, 0), (0, 30, 0), (0, 32, 0)])
@pytest.mark.parametrize("name", ["DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"])
def test_deepseek_without_q_lora_rank_builds_kv_a_proj_alone(release, name):
    """vLLM 0.28-0.32 build q_proj and kv_a_proj_with_mqa, no fused_qkv_a_proj, where q_lora_rank is null.
    DeepseekV3ForCausalLM is DeepseekV2ForCausalLM's class body (0.32 deepseek_v2.py:2005-2006), so it reads
    q_lora_rank the same way (:1318, :1904-1909): V3-architecture configs with q_lora_rank null are published
    (Moonlight-16B-A3B; Kimi-VL-A3B's deepseek_v3 text part); its MTP drafter's layer is built again too."""
    [profile] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.release == release]
    row = profile.row(name, config={"q_lora_rank": None})
    modules = row.built_quantized.entry["modules"]
    assert "model.layers.*.self_attn.kv_a_proj_with_mqa" in modules and "model.layers.*.self_attn.q_proj" in modules
    assert "fused_qkv_a_proj" not in row.fused_layers
    assert "fused_qkv_a_proj" in profile.row(name, config={"q_lora_rank": 8}).fused_layers
    drafter = row.built_quantized.entry.get("mtp", {}).get("modules", {})
    assert not [m for m in drafter if m.endswith("fused_qkv_a_proj")], drafter


def test_minicpm_moe_nvfp4_experts_are_called_unloadable(capsys, tmp_path):
    """vLLM 0.32's MiniCPMMoE holds its experts in BF16 ws / w2s parameters (minicpm.py:122-139, no quant method) and
    its expert mapping rewrites `experts.0.w1.weight` inside `experts.0.w1.weight_scale` too (minicpm.py:495-537):
    load_weights raises KeyError 'layers.0.mlp.ws_scale'. Was a strict xfail (doctor said nothing to do for NVFP4-stored
    experts): the variant now records what its load_weights raises on (tools/vllm_expert_refusals.py, the profile's
    variants `weight_refused`), and doctor reports it as vLLM's error."""
    from tests.conftest import run_captured
    from tests.test_remote_config_rows import minicpm_moe
    from tools.real_fixture import write_real_model

    moe = minicpm_moe(write_real_model(tmp_path / "qwen3", "qwen3-32b"), tmp_path / "moe")
    code, out, _ = run_captured(capsys, "doctor", moe, "--target", "vllm==0.32.0")
    assert code == 1 and "mlp.experts.0.w1" in out, out
    assert "it raises KeyError: 'layers.0.mlp.ws_scale'" in out, out

