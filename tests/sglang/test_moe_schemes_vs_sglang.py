"""SGLang 0.5.23's own compressed-tensors MoE scheme choice on a weight-only NVFP4 config (compressed-tensors' NVFP4A16
preset), run on CPU (tools/sglang_moe_scheme_probe.py), against tools/sglang_moe_schemes.py, which compiles the
release's predicates from its source and asks them in get_moe_scheme's order: every answer the same, the scheme the
release builds where the data records no refusal, and the release's own chain with its weight-only branch answering
False raising the error the data records for 0.5.9-0.5.11 (which lack that branch). doctor, on the same kind of
checkpoint, says nothing of a build refusal for 0.5.23 and names the error for the older releases."""

from __future__ import annotations

import pytest

from repair.targets.runtime_rules import shipped_rules
from .probe import TARGET, repair_json, requires_sglang, run_tool_probe

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture(scope="module")
def ran() -> dict:
    return run_tool_probe("sglang_moe_scheme_probe.py")["W4A16_NVFP4"]


def facts() -> dict:
    return {r.label: r.moe_scheme_refused for r in shipped_rules() if r.runtime == "sglang"}


def test_the_compiled_predicates_answer_as_the_releases_own_methods(ran):
    assert ran["compiled"] == ran["real"] and ran["real"]["_is_fp4a16_nvfp4"] == "holds", ran
    assert ran["stubs_called"] == [], ran


def test_sglang_0_5_23_builds_the_weight_only_moe_and_its_data_records_no_refusal(ran):
    assert ran["scheme"] == "CompressedTensorsW4A16Nvfp4MoE", ran
    assert facts()["sglang 0.5.23"] == {}


def test_the_chain_without_a_weight_only_branch_raises_what_the_older_releases_data_says(ran):
    for label in ("sglang 0.5.9", "sglang 0.5.10", "sglang 0.5.11"):
        assert ran["without"] == "raises " + facts()[label]["compressed-tensors"]["W4A16_NVFP4"]["error"], (label, ran)


def test_doctor_on_a_weight_only_moe(tmp_path, ran):
    from tests.test_expert_scales import compressed_tensors_moe
    from tests.test_expert_scales_sglang import weight_only

    src = weight_only(compressed_tensors_moe(tmp_path, broken=()))
    code, doc = repair_json("doctor", src, "--target", TARGET)
    assert code == 0 and not doc["findings"], doc
    code, doc = repair_json("doctor", src, "--target", "sglang==0.5.11")
    assert code == 1 and [s["error"] for s in doc["runtime_stops_at"]] == [ran["without"][len("raises "):]], doc
