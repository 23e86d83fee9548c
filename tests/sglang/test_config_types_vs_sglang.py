"""The model types SGLang 0.5.23's config reader knows, asked of the installed release (tools/sglang_config_types_probe.py:
its transformers' CONFIG_MAPPING once SGLang's get_config module has registered its own classes), against the rules
file's `config_model_types` read from the wheel (tools/sglang_config_types.py); and get_config's refusal of a type
neither knows, in the words the file records."""

from __future__ import annotations

import json

import pytest

from repair.targets.profiles import resolve

from .probe import TARGET, requires_sglang, run_tool_probe

pytestmark = [pytest.mark.sglang, requires_sglang]


def test_the_recorded_model_types_are_the_ones_sglang_reads(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "not_a_model_type", "architectures": ["LlamaForCausalLM"]}))
    found = run_tool_probe("sglang_config_types_probe.py", str(tmp_path))
    fact = resolve(TARGET).profile.rules.config_model_types
    assert found["transformers"] == fact["transformers"]
    assert sorted(set(found["known"]) - fact["known"]) == [] and sorted(fact["known"] - set(found["known"])) == []
    refusal = fact["error"].replace("{model_type}", "not_a_model_type")
    assert found["said"][str(tmp_path)].startswith(refusal.partition(". ")[0]), found["said"]
