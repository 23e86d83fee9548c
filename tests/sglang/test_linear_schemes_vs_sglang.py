"""SGLang 0.5.23's own compressed-tensors Linear scheme choice (`_get_scheme_from_parts`) on a weight-only NVFP4 config
(compressed-tensors' NVFP4A16 preset, nvfp4-pack-quantized), run on CPU (tools/sglang_linear_scheme_probe.py), against
tools/sglang_linear_schemes.py, which compiles the release's predicates and asks them in the method's order: the same
answers, the scheme the release builds where the data records no refusal, and the method refusing once its weight-only
branch answers False (what 0.5.9-0.5.21, without that branch, do: their own predicates, read from their wheels, raise
earlier, at _is_static_tensor_w8a8; 0.5.23's no longer read the null input args, so it reaches its final raise)."""

from __future__ import annotations

import pytest

from repair.targets.runtime_rules import shipped_rules
from .probe import TARGET, repair_json, requires_sglang, run_tool_probe

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture(scope="module")
def ran() -> dict:
    return run_tool_probe("sglang_linear_scheme_probe.py")["W4A16_NVFP4"]


def test_the_compiled_predicates_answer_as_the_releases_own_methods(ran):
    assert ran["compiled"] == ran["real"] and ran["real"]["_is_fp4a16_nvfp4"] == "holds", ran
    assert ran["stubs_called"] == [], ran


def test_sglang_0_5_23_builds_the_weight_only_linear_and_its_data_records_no_refusal(ran):
    assert ran["scheme"] == "CompressedTensorsW4A16Fp4" and ran["read"] is None, ran
    assert {r.label: r.linear_scheme_refused for r in shipped_rules()}["sglang 0.5.23"] == {}
    assert ran["without"].startswith("raises "), ran  # the weight-only branch is what builds it


def test_doctor_on_a_dense_weight_only_model(tmp_path, ran):
    from tests.test_moe_scheme_refused import dense_weight_only

    src = dense_weight_only(tmp_path)
    code, doc = repair_json("doctor", src, "--target", TARGET)
    assert code == 0 and not doc["findings"], doc
    code, doc = repair_json("doctor", src, "--target", "sglang==0.5.11")
    assert code == 1 and [s["tensor"] for s in doc["runtime_stops_at"]] == ["model.layers.0.self_attn.qkv_proj"], doc


@pytest.fixture(scope="module")
def mixed() -> dict:
    return run_tool_probe("sglang_linear_scheme_probe.py")["mixed"]


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4", "FP8", "FP8_BLOCK"])
def test_a_group_in_a_mixed_precision_config_as_0_5_23_reads_it_and_as_0_5_16_did(mixed, algo):
    """0.5.23's own from_config on a `mixed-precision` config: with the group's own format its scheme map keeps the
    group's input args and a built branch answers (the tool reads no refusal; on this host the scheme's CUDA capability
    query follows); without it (the top-level format read, what 0.5.9-0.5.16 do for every group) the map drops them and
    the method raises what the tool's walk with the gate shut says."""
    group, config = mixed[algo]["group"], mixed[algo]["config"]
    assert group["inputs_kept"] == (algo != "W4A16_NVFP4") and group["answers"].endswith(" holds"), group
    assert group["tool"] is None and (group["real"].startswith("CompressedTensors")
                                      or group["real"] == "raises AssertionError: Torch not compiled with CUDA enabled"), group
    assert not config["inputs_kept"] and config["real"] == "raises " + config["tool"]["error"], config
