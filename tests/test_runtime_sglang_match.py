"""SGLang's is_layer_excluded next to vLLM's ModelOpt rule, entry by entry (issue 28 point 1), on real entries.

SGLang 0.5.23 modelopt_quant.py: each entry becomes a regex (`.` escaped, `*` -> `.*`, nothing else), fullmatched
against the prefix, the prefix without `language_model.`, and every dotted part of them; an entry ending in an MLA
projection name excludes any layer whose last part contains it. vLLM 0.32 uses substring and fnmatch. The lists are
published ones (tests/data/real, tools/real_fixture.py).
"""

from __future__ import annotations

import json
from types import MappingProxyType

from repair.formats.modelopt_nvfp4 import modelopt_rule
from repair.targets.matchers import exclusion_matcher
from repair.targets.sglang_match import Building
from tools.real_fixture import QWEN36_MTP_PREFIXES, REAL

QWEN3_MOE = Building(MappingProxyType({"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}),
                     MappingProxyType({}), fallback=True)


def sglang(entries: list[str], release_rule: str = "sglang_modelopt_dotted", building: Building = QWEN3_MOE):
    return exclusion_matcher(release_rule)(tuple(entries), None, building)


def test_a_wildcard_entry_matches_one_dotted_part_so_mtp_star_excludes_the_mtp_experts():
    entries = [f"{p}*" for p in QWEN36_MTP_PREFIXES]  # what ModelOpt 0.44 writes for Qwen3.6's MTP block
    assert sglang(entries).excludes("mtp.layers.0.mlp.experts.3.down_proj")  # its FusedMoE, mtp.layers.0.mlp.experts
    assert sglang(["q*_proj"]).excludes("model.layers.0.self_attn.q_proj")  # part `qkv_proj` of its fused layer; fnmatch needs the whole name
    assert not modelopt_rule(["q*_proj"]).excludes("model.layers.0.self_attn.q_proj")


def test_language_model_prefix_is_also_tried_without_it():
    assert sglang(["model.layers.0.self_attn.o_proj"]).excludes("language_model.model.layers.0.self_attn.o_proj")


def test_an_mla_projection_entry_excludes_that_projection_in_every_layer():
    """deepseek-r1's exact `model.layers.5.self_attn.kv_b_proj` excludes layer 0's too: the MLA case compares only
    the entry's last part with the prefix's."""
    hf = json.loads((REAL / "deepseek-r1-fp4" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert "model.layers.0.self_attn.kv_b_proj" in hf
    assert sglang(["model.layers.5.self_attn.kv_b_proj"]).excludes("model.layers.0.self_attn.kv_b_proj")
    assert not modelopt_rule(["model.layers.5.self_attn.kv_b_proj"]).excludes("model.layers.0.self_attn.kv_b_proj")


def test_question_mark_is_a_regex_quantifier_not_fnmatchs_one_character():
    entry = ["model.layers.1?.mlp.down_proj"]
    assert sglang(entry).excludes("model.layers.1.mlp.down_proj") and not sglang(entry).excludes("model.layers.12.mlp.down_proj")
    assert modelopt_rule(entry).excludes("model.layers.12.mlp.down_proj") and not modelopt_rule(entry).excludes("model.layers.1.mlp.down_proj")


def test_an_expert_entry_reaches_a_fusedmoe_only_through_its_globs():
    """is_layer_skipped is not asked for FusedMoE: an exact per-expert entry (qwen3-30b-a3b lists routers, not
    experts) leaves the experts quantized, a glob over the experts' parent does not."""
    assert not sglang(["model.layers.3.mlp.experts.0.down_proj"]).excludes("model.layers.3.mlp.experts.1.up_proj")
    assert sglang(["model.layers.3.mlp.experts*"]).excludes("model.layers.3.mlp.experts.1.up_proj")


def test_substring_releases_let_a_router_entry_swallow_a_dense_gate_up_proj():
    entry, no_fallback = ["model.layers.0.mlp.gate"], Building(QWEN3_MOE.fusions, QWEN3_MOE.packed, fallback=False)  # <= 0.5.10
    assert sglang(entry, "sglang_modelopt_substring", no_fallback).excludes("model.layers.0.mlp.gate_proj")
    assert not sglang(entry, "sglang_modelopt_dotted").excludes("model.layers.0.mlp.gate_proj")


def test_a_trailing_dot_entry_is_a_path_for_0_5_13_on_and_matches_nothing_before():
    """_module_path_match (quantization/utils.py) strips a trailing `.` from the entry and the prefix from 0.5.13 on
    (0.5.13 utils.py:53-54, 0.5.23 the same); 0.5.11/0.5.12's compare them as written (0.5.12 utils.py:48-57), so
    `model.layers.0.self_attn.` is no module path of `model.layers.0.self_attn.o_proj`, and is_layer_excluded's
    fullmatch of the escaped entry fails too."""
    from repair.targets.runtime_rules import shipped_rules

    matchers = {r.label: r.matchers["modelopt"] for r in shipped_rules() if r.runtime == "sglang"}
    entry, prefix = ["model.layers.0.self_attn."], "model.layers.0.self_attn.o_proj"
    for label, excludes in (("sglang 0.5.11", False), ("sglang 0.5.12", False), ("sglang 0.5.23", True)):
        assert sglang(entry, matchers[label]).excludes(prefix) is excludes, label
    assert sglang(["model.layers.0.self_attn"], matchers["sglang 0.5.12"]).excludes(prefix)
