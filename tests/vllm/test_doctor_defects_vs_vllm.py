"""Each vLLM-facing defect class, one folder each: vLLM's literal message and doctor's, and the classes
where vLLM loads silently (what weights tracking names, silent garbage, vLLM 0.32's post-load NaN check).
The rules for comparing messages are in test_doctor_vs_vllm.py's docstring.
"""

from __future__ import annotations

import pytest

from .doctor_cases import (
    DOWN0,
    NAN_CHECK,
    NOT_INITIALISED,
    Q0,
    assert_doctor_matches,
    doctor,
    findings,
    marks_of,
    param_id,
    same_message,
    stop_at,
    uninitialised,
    vllm_message,
)
from .probe import Run, assert_params_match, expected_params, needs_legacy, requires_vllm, sha
from repair.targets.vllm_loader import vllm_name

pytestmark = [pytest.mark.vllm, requires_vllm]


# --------------------------------------------------------------------------------------------------------
# each vLLM-facing defect class: vLLM's literal message, and doctor's
# --------------------------------------------------------------------------------------------------------
def no_param(name: str, module: str, cls: str, params: tuple[str, ...] = ("weight",)) -> str:
    listed = "{" + ", ".join(repr(f"{module}.{p}") for p in params) + "}"
    return (f"ValueError: There is no module or parameter named {name!r} in Gemma4MTP. "
            f"The available parameters belonging to {module} ({cls}) are: {listed}")


NVFP4 = ("weight", "weight_scale", "weight_scale_2", "input_scale")
PRE, POST, VDOWN0 = "model.pre_projection", "model.post_projection", DOWN0
CLASS_CASES = [
    # leftover scales on a BF16 module: >= 0.25 raises, 0.21-0.24 drops them (test_leftover_scale_dropped_legacy)
    ("leftover", Run("installed"), "pre_projection.weight_scale",
     no_param(f"{PRE}.weight_scale", PRE, "ColumnParallelLinear")),
    ("leftover", Run("installed", 2, 1), "pre_projection.weight_scale",
     no_param(f"{PRE}.weight_scale", PRE, "ColumnParallelLinear")),
    ("leftover_bf16", Run("installed"), "pre_projection.weight_scale",
     no_param(f"{PRE}.weight_scale", PRE, "ColumnParallelLinear")),
    # an unknown tensor on an NVFP4 module: vLLM lists the four NVFP4 parameters as a set (compared as one)
    ("stray_on_nvfp4", Run("installed"), f"{DOWN0}.weight_zero",
     no_param(f"{VDOWN0}.weight_zero", VDOWN0, "RowParallelLinear", NVFP4)),
    # excluded in the config but packed: the first tensor in sorted order fails
    ("excluded_packed", Run("installed"), "post_projection.input_scale",
     no_param(f"{POST}.input_scale", POST, "RowParallelLinear")),
    ("excluded_packed", Run("installed", 2, 1), "post_projection.input_scale",
     no_param(f"{POST}.input_scale", POST, "RowParallelLinear")),
    ("r31_excluded_packed", Run("installed"), "post_projection.input_scale",
     no_param(f"{POST}.input_scale", POST, "RowParallelLinear")),
    ("r31_excluded_packed", Run("installed", 2, 1), "post_projection.input_scale",
     no_param(f"{POST}.input_scale", POST, "RowParallelLinear")),
    ("excluded_packed_noinput", Run("installed"), "post_projection.weight",
     "RuntimeError: start (0) + length (64) exceeds dimension size (32)."),
    ("excluded_packed_noinput", Run("installed", 2, 1), "post_projection.weight",
     "RuntimeError: start (32) + length (32) exceeds dimension size (32)."),
    ("excluded_packed_noinput", Run("installed", 2, 0), "post_projection.weight_scale",  # rank 0's half fits
     no_param(f"{POST}.weight_scale", POST, "RowParallelLinear")),
    # packed tensors under a BF16 declaration (no quantization_config)
    ("undeclared", Run("installed"), f"{DOWN0}.input_scale",
     no_param(f"{VDOWN0}.input_scale", VDOWN0, "RowParallelLinear")),
    ("r31_undeclared", Run("installed"), f"{DOWN0}.input_scale",
     no_param(f"{VDOWN0}.input_scale", VDOWN0, "RowParallelLinear")),
    ("r31_undeclared", Run("installed", 2, 1), f"{DOWN0}.input_scale",
     no_param(f"{VDOWN0}.input_scale", VDOWN0, "RowParallelLinear")),
    ("undeclared_noinput", Run("installed"), f"{DOWN0}.weight",
     "RuntimeError: start (0) + length (128) exceeds dimension size (64)."),
    ("undeclared_noinput", Run("installed", 2, 1), f"{DOWN0}.weight",
     "RuntimeError: start (64) + length (64) exceeds dimension size (64)."),
    ("undeclared_noinput", Run("installed", 2, 0), f"{DOWN0}.weight_scale",
     no_param(f"{VDOWN0}.weight_scale", VDOWN0, "RowParallelLinear")),
    ("undeclared_noinput", Run("legacy"), f"{DOWN0}.weight",
     "RuntimeError: start (0) + length (128) exceeds dimension size (64)."),
    # NVFP4 scales of the wrong shape: block scales narrow like the weight, per-tensor scales must be 0-d/[1]
    ("scale_shape_row", Run("installed"), f"{DOWN0}.weight_scale",
     "RuntimeError: start (0) + length (8) exceeds dimension size (4)."),
    ("scale_shape_row", Run("installed", 2, 1), f"{DOWN0}.weight_scale",
     "RuntimeError: start (4) + length (4) exceeds dimension size (4)."),
    ("scale_shape_col", Run("installed"), f"{Q0}.weight_scale",
     "RuntimeError: start (0) + length (64) exceeds dimension size (32)."),
    ("scale_shape_col", Run("installed", 2, 1), f"{Q0}.weight_scale",
     "RuntimeError: start (32) + length (32) exceeds dimension size (32)."),
    ("scale2_shape", Run("installed"), f"{DOWN0}.weight_scale_2",
     "AssertionError: (no message) shape check in BasevLLMParameter._assert_and_load fails"),
]


@pytest.mark.parametrize("name,run,tensor,message", [
    pytest.param(*c, id=param_id(c[0], c[1]), marks=marks_of(c[1])) for c in CLASS_CASES])
def test_defect_class_messages(probe, folders, name, run, tensor, message):
    res = probe(name, *run)
    stop = stop_at(doctor(folders[name], run.behaviour, run.tp_size), run.tp_rank)
    assert stop is not None and stop["tensor"] == tensor, stop
    assert same_message(stop["error"], message), stop["error"]
    assert_doctor_matches(doctor(folders[name], run.behaviour, run.tp_size), res, run.tp_rank)
    if not message.startswith("AssertionError: (no message)"):
        assert same_message(message, vllm_message(res)), vllm_message(res)


@pytest.mark.parametrize("name,tp,rank", [("noinput", 1, 0), ("noinput", 2, 1), ("broken_noinput", 1, 0)])
def test_missing_input_scale_is_what_weights_tracking_names(probe, folders, name, tp, rank):
    """vLLM with weights tracking names exactly the input_scales doctor's missing-input-scale findings name;
    without tracking (vLLM's default for quantized drafts) it loads, as doctor predicts (no stop)."""
    report = doctor(folders[name], "installed", tp)
    assert stop_at(report, rank) is None
    predicted = {vllm_name(f"{s}.input_scale") for s in findings(report, "missing-input-scale")}
    res = probe(name, "installed", tp, rank)
    assert vllm_message(res).startswith(NOT_INITIALISED)
    assert uninitialised(res) == predicted
    assert probe(name, "installed", tp, rank, weights_track=False)["ok"]


@pytest.mark.parametrize("tp,rank", [(1, 0), (2, 1)])
def test_bf16_weight_under_nvfp4_declaration_loads_garbage_then_fails_post_check(probe, folders, tp, rank):
    """Row-parallel down_proj stored BF16 [64, 128] where the config declares NVFP4: vLLM narrows it into the
    uint8 [64, 64/tp] parameter without complaint; the loaded bytes are not what the correct checkpoint gives."""
    name = "bf16_declared_nvfp4"
    report = doctor(folders[name], "installed", tp)
    assert stop_at(report, rank) is None
    assert rank in findings(report, "silent-garbage")[DOWN0]["ranks"]
    # The weight loader copies the BF16 bytes into the uint8 parameter without complaint (what doctor's
    # silent-garbage names); vLLM 0.32 then notices in post-processing that this layer's scales stayed NaN.
    # That post-load check is not a per-tensor stop, so doctor reports it inside the finding's message.
    res = probe(name, "installed", tp, rank, weights_track=False)
    assert not res["ok"] and res["error_type"] == "RuntimeError", res
    assert res["error"].startswith("NVFP4 weight_scale for layer") and "was never loaded (still NaN)" in res["error"]
    assert "was never loaded (still NaN)" in findings(report, "silent-garbage")[DOWN0]["message"]
    tracked = probe(name, "installed", tp, rank)
    assert uninitialised(tracked) == {f"{DOWN0}.{leaf}" for leaf in ("weight_scale", "weight_scale_2", "input_scale")}


@needs_legacy
def test_packed_row_weight_loads_as_garbage_on_legacy_rank0(probe, folders):
    """0.21-0.24, TP=2: rank 0's half of a packed down_proj fits the BF16 parameter and loads as wrong values;
    rank 1's narrow fails, so the deployment fails: doctor reports a load-error (rank 1) that names rank 0's
    garbage, and predicts no stop for rank 0."""
    name = "packed_down0_in_bf16"
    report = doctor(folders[name], "legacy", 2)
    assert stop_at(report, 0) is None
    finding = findings(report, "load-error")[DOWN0]
    assert finding["ranks"] == [1] and "on rank(s) [0] the bytes fit and load as wrong values, silently" in finding["message"]
    assert stop_at(report, 1)["error"] == vllm_message(probe(name, "legacy", 2, 1))
    res = probe(name, "legacy", 2, 0)
    assert res["ok"], res
    correct = expected_params(folders["mo_fix_bf16"], 2, 0)
    got = res["params"][f"{DOWN0}.weight"]
    assert (got["dtype"], got["shape"]) == ("bfloat16", list(correct[f"{DOWN0}.weight"].shape))
    assert got["sha256"] != sha(correct[f"{DOWN0}.weight"])
    others = {n: p for n, p in res["params"].items() if n != f"{DOWN0}.weight"}
    assert_params_match({**res, "params": others}, {n: t for n, t in correct.items() if n != f"{DOWN0}.weight"})


@needs_legacy
def test_leftover_scale_dropped_legacy(probe, folders):
    """0.21-0.24 skip unknown names: a leftover scale on a BF16 checkpoint loads, with exactly the BF16 tensors."""
    report = doctor(folders["leftover_bf16"], "legacy")
    assert stop_at(report, 0) is None and "pre_projection.weight_scale" in findings(report, "ignored-tensors")["pre_projection"]["message"]
    assert_params_match(probe("leftover_bf16", "legacy"), expected_params(folders["mo_fix_bf16"]))


@pytest.mark.parametrize("name,code", [
    ("bf16_declared_nvfp4", "silent-garbage"), ("no_weight_scale", "missing-weight-scale"),
    ("nan_block_scale", "block-scales")])
def test_post_load_nan_check_of_vllm_032_is_a_documented_difference(probe, folders, name, code):
    """DOCUMENTED DIFFERENCE. vLLM 0.32 creates NVFP4 block scales filled with NaN and, in
    process_weights_after_loading (after every tensor loaded), raises if any NaN is left: a module declared
    NVFP4 but stored BF16, a packed module without weight_scale, or a stored NaN block scale all stop there
    (weights tracking off, vLLM's default for quantized drafts). 0.24 has no such check and the release
    that added it (0.25-0.32) is not known here, so the ">= 0.25" profile does not predict it as a
    per-rank stop: doctor reports each case as an error finding on that module and `runtime_stops_at` stays
    empty. Once the release is pinned, the check belongs in the profile and this test becomes an exact one."""
    report = doctor(folders[name], "installed")
    assert stop_at(report, 0) is None and report["exit_code"] == 1
    subject = f"{DOWN0}.weight_scale" if code == "block-scales" else DOWN0
    assert findings(report, code)[subject]["severity"] == "error"
    assert vllm_message(probe(name, "installed", weights_track=False)) == NAN_CHECK


def test_missing_weight_scale_2_loads_uninitialised(probe, folders):
    """No weight_scale_2: nothing checks it without weights tracking, so vLLM 0.32 loads (doctor: no stop,
    a missing-scale-2 error); with tracking vLLM names exactly that parameter."""
    report = doctor(folders["no_weight_scale_2"], "installed")
    assert stop_at(report, 0) is None and set(findings(report, "missing-scale-2")) == {DOWN0}
    assert probe("no_weight_scale_2", "installed", weights_track=False)["ok"]
    assert uninitialised(probe("no_weight_scale_2", "installed")) == {f"{DOWN0}.weight_scale_2"}
