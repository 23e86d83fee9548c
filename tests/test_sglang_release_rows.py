"""SGLang releases between the shipped ones get their own data file where their rule code is provably a shipped row's:
0.5.12's RULE_CODE units (utils.py, compressed_tensors/utils.py, the ModelOpt configs' exclusion and lookup methods,
model_config.py's quant parsing) are 0.5.11's, ast for ast, so tools/sglang_rules_data.py writes its file from that row
and its own wheel (its model registry, packed mappings; the MoE facts by their own generators). `--target
sglang==0.5.12` then reads it, not 0.5.11's: its registry has DeepSeek-V4, which 0.5.11's lacks. A release whose rule
code differs from the row it is said to be (0.5.13's quantization/utils.py against 0.5.11's) stops the generator."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from repair.targets import profiles
from repair.targets.runtime_rules import shipped_rules


def test_sglang_0_5_12_reads_its_own_file_whose_rules_are_0_5_11s():
    target = profiles.resolve("sglang==0.5.12")
    assert target.profile.rules.source == "sglang-0.5.12.json" and "newest shipped" not in target.label, target.label
    rules = {r.label: r for r in shipped_rules()}
    old, new = rules["sglang 0.5.11"], rules["sglang 0.5.12"]
    assert new.matchers == old.matchers and new.fallback_fused == old.fallback_fused and new.fused == old.fused
    assert "DeepseekV4ForCausalLM" in new.registry and "DeepseekV4ForCausalLM" not in old.registry
    assert new.refused_algorithms["MIXED_PRECISION"].startswith("SGLang 0.5.12 reads"), new.refused_algorithms
    assert new.moe_scheme_refused["compressed-tensors"].keys() == old.moe_scheme_refused["compressed-tensors"].keys()


def test_a_release_said_to_be_another_whose_rule_code_differs_stops_the_generator(monkeypatch):
    wheels = {v: glob.glob(f"{root}/{v}/sglang-{v}-*.whl") for v, root in (("0.5.11", "/tmp/sglx"),
                                                                            ("0.5.12", "/tmp/sglwheels"),
                                                                            ("0.5.13", "/tmp/sglwheels"))}
    if not all(wheels.values()):
        pytest.skip("the SGLang wheels are not downloaded (pip download --no-deps sglang==X)")
    from tools import sglang_rules_data

    paths = {v: Path(w[0]) for v, w in wheels.items()}
    assert sglang_rules_data.row("0.5.12", paths)["matchers"] == sglang_rules_data.RULES["0.5.11"]["matchers"]
    monkeypatch.setitem(sglang_rules_data.RULES, "0.5.13", {"same_as": "0.5.11"})
    with pytest.raises(SystemExit, match=r"quantization/utils.py.* differ from 0.5.11's: read its rules anew"):
        sglang_rules_data.row("0.5.13", paths)
    with pytest.raises(SystemExit, match="give 0.5.11's wheel too"):
        sglang_rules_data.row("0.5.12", {"0.5.12": paths["0.5.12"]})
