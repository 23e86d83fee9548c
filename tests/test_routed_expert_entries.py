"""Per-expert exclusion entries under vLLM's ModelOpt rule (#28, vmoe): vLLM builds one routed-experts layer
(`...mlp.experts`, its FusedMoE) and asks its quant config only with that name. quant_utils.is_layer_skipped's
"exact" mode has an experts branch (0.28, 0.30 and 0.32 alike): a prefix holding "experts" is skipped when it is
contained in an entry that holds "experts", so `model.layers.10.mlp.experts.1.gate_proj` (as ModelOpt writes one
BF16 expert) excludes the whole layer: vLLM builds every expert of it BF16 and stops on the experts still stored
packed. The vLLM tier checks the rule and both loads (tests/vllm/test_routed_expert_entries_vs_vllm.py)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from safetensors import safe_open

from repair.formats.base import routed_layer
from repair.formats.modelopt_nvfp4 import containing, modelopt_rule
from tests.test_regex_index import vllm_modelopt_excludes
from tests.conftest import read_json, run_captured
from tools.real_fixture import REAL_MODELS, write_real_model

MOE = "model.layers.10.mlp.experts"
EXPERT_ENTRIES = [f"{MOE}.1.{p}" for p in ("gate_proj", "up_proj", "down_proj")]  # as ModelOpt writes a BF16 expert
TARGET = "vllm==0.32.0"


def write_one_bf16_expert(folder: Path, entries: list[str]) -> Path:
    """The DeepSeek-V3-0324 layout (tests/data/real) with routed expert 1 of layer 10 stored BF16 and `entries` added
    to hf_quant_config.json's exclusions."""
    model = REAL_MODELS["deepseek-v3-0324"]
    model = dataclasses.replace(model, bf16=model.bf16 + rf"|^{MOE.replace('.', '[.]')}[.]1[.]")
    src = write_real_model(folder, "deepseek-v3-0324", model)
    hf = read_json(src / "hf_quant_config.json")
    hf["quantization"]["exclude_modules"] += entries
    (src / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    return src


@pytest.fixture(scope="module")
def one_bf16_expert(tmp_path_factory) -> Path:
    return write_one_bf16_expert(tmp_path_factory.mktemp("routed-expert-entries") / "src", EXPERT_ENTRIES)


def test_an_expert_entry_excludes_every_expert_of_its_layer_and_no_other_layer():
    rule = modelopt_rule(EXPERT_ENTRIES)
    for name in (MOE, f"{MOE}.0.gate_proj", f"{MOE}.1.down_proj", f"{MOE}.255.up_proj"):
        assert rule.excludes(name), name
    for name in ("model.layers.1.mlp.experts.0.gate_proj", "model.layers.11.mlp.experts.1.gate_proj",
                 "model.layers.10.mlp.shared_experts.down_proj", "model.layers.10.mlp.gate", "model.layers.10.self_attn.o_proj"):
        assert not rule.excludes(name), name
    assert modelopt_rule([f"{MOE}.1*"]).excludes(f"{MOE}.0.up_proj")  # ModelOpt's wildcard form: the layer too
    assert not modelopt_rule(["*experts.1*"]).excludes(f"{MOE}.0.up_proj")  # neither contains nor matches the layer
    assert modelopt_rule(EXPERT_ENTRIES).used_entries([f"{MOE}.0.gate_proj"]) == set(EXPERT_ENTRIES)


def test_doctor_says_vllm_builds_the_whole_moe_bf16_over_packed_experts(capsys, one_bf16_expert):
    code, out, err = run_captured(capsys, "doctor", one_bf16_expert, "--target", TARGET, "--json")
    assert code == 1, (out, err)
    report = json.loads(out)
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert errors and all("excludes its routed-experts layer (`...experts`" in f["message"] for f in errors), errors
    assert report["schemes"].get(f"{MOE}.0.gate_proj", "bf16") != "nvfp4", report["schemes"]


def test_fix_turns_the_whole_moe_bf16_and_doctor_is_then_clean(capsys, one_bf16_expert, tmp_path):
    """vLLM builds the layer BF16 from the entries as written; fix dequantizes the experts still packed under it."""
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", one_bf16_expert, "-o", out, "--target", TARGET)
    assert code == 0, err
    listed = read_json(out / "hf_quant_config.json")["quantization"]["exclude_modules"]
    assert modelopt_rule(listed).excludes(MOE), listed
    with safe_open(out / "model.safetensors", "pt") as f:
        packed = [k for k in f.keys() if k.startswith(MOE + ".") and k.endswith("weight_scale")]
    assert not packed, packed
    code, report, err = run_captured(capsys, "doctor", out, "--target", TARGET, "--strict")
    assert code == 0, (report, err)


PART = st.sampled_from(["model", "layers", "1", "10", "mlp", "experts", "shared_experts", "expertsexperts", "0", "x"])
DOTTED = st.lists(PART, min_size=1, max_size=6).map(".".join)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(entries=st.lists(DOTTED, min_size=1, max_size=6), layers=st.lists(DOTTED, min_size=1, max_size=6))
def test_containing_is_the_experts_branch_entry_by_entry(entries, layers):
    """The one-pass lookup equals is_layer_skipped's test as written: `prefix in entry`, both holding "experts"."""
    assert containing(entries, layers) == {e for e in entries if "experts" in e and any("experts" in p and p in e for p in layers)}


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(entries=st.lists(DOTTED | st.sampled_from(["experts\n1", "s\nexperts", "*experts*", "mlp.experts.1*"]), min_size=1, max_size=6),
       names=st.lists(DOTTED | st.just("model.experts\n1.experts.0.up"), min_size=1, max_size=6))
def test_excludes_is_vllms_rule_on_the_layer_vllm_asks(entries, names):
    """modelopt_rule on any name equals vLLM's is_layer_excluded on the name its layer asks with (tests/test_regex_index
    has the substring/fnmatch half as written there), hostile newlines included."""
    rule = modelopt_rule(entries)
    for name in names:
        layer = routed_layer(name)
        vllm = any(vllm_modelopt_excludes(layer, e) for e in entries) or (
            "experts" in layer and any("experts" in e and layer in e for e in entries))
        assert rule.excludes(name) == vllm, (name, entries)


@pytest.mark.parametrize("targets", ["vllm==0.32.0,sglang==0.5.23", "vllm==0.28.0,vllm==0.32.0,sglang==0.5.23,trtllm==1.2.0"])
def test_fix_for_several_targets_names_the_layer_and_drops_the_expert_entries(capsys, one_bf16_expert, tmp_path, targets):
    """SGLang and TensorRT-LLM read no per-expert entry (their MoE asks only `...mlp.experts`): fix names the layer
    whole, and the per-expert entries, which vLLM read and SGLang calls unused, go (they refused: exit 2)."""
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", one_bf16_expert, "-o", out, "--target", targets)
    assert code == 0, err
    listed = read_json(out / "hf_quant_config.json")["quantization"]["exclude_modules"]
    assert MOE in listed and not set(EXPERT_ENTRIES) & set(listed), [e for e in listed if MOE in e]
    for target in targets.split(","):
        code, report, err = run_captured(capsys, "doctor", out, "--target", target, "--strict")
        assert code == 0, (target, report, err)
