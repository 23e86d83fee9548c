"""The shipped repair/targets/data/sglang-0.5.23.json says what SGLang 0.5.23's own code says (like
tests/vllm/test_profiles_vs_vllm.py for vLLM): a release's data that drifts from its code fails here.

- Exclusion matching: the data's `modelopt` and `compressed-tensors` matchers (repair/targets/matchers.py) give
  SGLang's answer (BF16, quantized, or its fused-shard error, verbatim) on every exclusion list of the real
  configs and on entries whose meaning differs between glob, regex and dotted paths, over real layer names.
- Packed mappings: the data's `packed_modules_mapping` is what each registered model class declares, and, for
  every real fixture SGLang builds, what its quant config holds once the model is built (DeepSeek adds
  fused_qkv_a_proj_with_mqa in __init__).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.targets.matchers import EXCLUSION_MATCHERS
from repair.targets.runtime_rules import read_rules
from repair.targets.sglang_match import Building
from tools.real_fixture import REAL

from .probe import REPO, requires_sglang, run_probe

pytestmark = [pytest.mark.sglang, requires_sglang]
SHIPPED = REPO / "repair" / "targets" / "data" / "sglang-0.5.23.json"
FUSIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
MLA = {"fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]}
HOSTILE = [["*.q_proj"], ["gate"], ["0"], ["mlp.gate"], ["model.layers.1?.mlp.gate"], ["model.layers.[0-1].self_attn*"],
           ["lm_head"], ["*experts*"], ["model.layers.0.self_attn.q_proj"], ["model.layers.0.mlp.gate_proj",
           "model.layers.0.mlp.up_proj"], ["language_model.model.layers.0.mlp.down_proj"], ["kv_a_proj_with_mqa"],
           ["model.layers.0.self_attn.kv_a_proj_with_mqa"], ["model.layers.61*"], ["re:.*self_attn.*"], ["*"], [],
           # a fused layer named whole, or its shards by substring, glob or regex only (vLLM asks the fused prefix too)
           ["model.layers.0.self_attn.qkv_proj"], [f"layers.0.self_attn.{s}" for s in ("q_proj", "k_proj", "v_proj")],
           ["*.self_attn.qkv?proj"], [f"*.layers.0.self_attn.{s}" for s in ("q_proj", "k_proj", "v_proj")],
           [r"re:.*self_attn\.q"], [r"re:.*self_attn\.qkv_proj$"], ["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.q_proj"]]
PREFIXES = [("model.layers.0.self_attn.qkv_proj", "linear"), ("model.layers.0.self_attn.o_proj", "linear"),
            ("model.layers.0.mlp.gate_up_proj", "linear"), ("model.layers.0.mlp.down_proj", "linear"),
            ("model.layers.0.mlp.gate", "linear"), ("model.layers.10.mlp.gate", "linear"),
            ("model.layers.0.mlp.experts", "moe"), ("model.layers.61.mlp.experts", "moe"), ("lm_head", "linear"),
            ("language_model.model.layers.0.mlp.down_proj", "linear"), ("model.layers.0.self_attn.fused_qkv_a_proj_with_mqa", "linear"),
            ("model.layers.0.self_attn.kv_b_proj", "linear"), ("model.layers.61.eh_proj", "linear")]


def real_exclusion_lists() -> list[list[str]]:
    out = []
    for path in sorted(REAL.glob("*/hf_quant_config.json")):
        entries = json.loads(path.read_text()).get("quantization", {}).get("exclude_modules")
        if entries:
            out.append(entries)
    return out


def cases() -> list[dict]:
    out = []
    for entries in [*real_exclusion_lists(), *HOSTILE]:
        for packed in ({}, MLA):
            out += [{"kind": "modelopt", "entries": entries, "prefix": p, "layer": layer, "packed": packed} for p, layer in PREFIXES]
            out += [{"kind": "compressed-tensors", "entries": entries, "prefix": p, "layer": layer, "packed": packed or dict(FUSIONS)}
                    for p, layer in PREFIXES if layer == "linear"]
    return out


def predicted(rules: dict, case: dict) -> str:
    building = Building(fusions=FUSIONS, packed={k: tuple(v) for k, v in case["packed"].items()}, fallback=rules["fallback_fused"])
    rule = EXCLUSION_MATCHERS[rules["matchers"][case["kind"]]](tuple(case["entries"]), None, building)
    name = f"{case['prefix']}.0.gate_proj" if case["layer"] == "moe" else case["prefix"]
    error = rule.fused_refusal(name, ())
    answer = f"error: {error}" if error else ("bf16" if rule.excludes(name) else "quantized")
    leaf = name.rpartition(".")[2]
    for shard in FUSIONS.get(leaf, ()) if error is None else ():  # doctor asks with a stored shard's name
        assert rule.excludes(name.replace(leaf, shard)) is (answer == "bf16"), (case, shard)
    return answer


@pytest.fixture(scope="module")
def sglang(tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("rules") / "cases.json"
    path.write_text(json.dumps(cases()))
    (line,) = run_probe("rules", path)
    return line


def test_exclusion_matchers_give_sglangs_answers(sglang):
    rules = json.loads(SHIPPED.read_text())["rules"]
    wrong = [(c["kind"], c["entries"][:3], c["prefix"], c["packed"] and "MLA", predicted(rules, c), a)
             for c, a in zip(cases(), sglang["answers"]) if predicted(rules, c) != a]
    assert not wrong, f"{len(wrong)} of {len(cases())} (kind, entries, prefix, packed, data, SGLang): {wrong[:8]}"


def test_packed_mappings_are_the_model_classes(sglang):
    shipped = json.loads(SHIPPED.read_text())["rules"]["packed_modules_mapping"]
    declared = sglang["packed_modules_mapping"]
    differ = {a: (shipped.get(a), declared.get(a)) for a in set(shipped) | set(declared) if shipped.get(a) != declared.get(a)}
    assert not differ, f"architecture -> (data, SGLang's class): {differ}"


def test_packed_mappings_are_what_the_built_models_hold(sglang_verdicts):
    """The data's mapping for the fixture's config (its class's, plus `packed_when_config`: DeepSeek's __init__ adds
    fused_qkv_a_proj_with_mqa when q_lora_rank is set), as doctor builds it, is what SGLang's quant config holds."""
    rules = read_rules(json.loads(SHIPPED.read_text()), SHIPPED.name)

    def data(line: dict) -> dict:
        config = json.loads((Path(line["dir"]) / "config.json").read_text())
        return {k: list(v) for k, v in rules.building(line["architecture"], None, config).packed.items()}
    differ = {name: (data(line), line["packed"]) for name, line in sglang_verdicts.items()
              if "packed" in line and data(line) != line["packed"]}
    assert not differ, f"fixture -> (data, SGLang's quant config after building the model): {differ}"
