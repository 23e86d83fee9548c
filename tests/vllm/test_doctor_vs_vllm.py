"""`ckpt-repair doctor` against vLLM's own drafter loader: every prediction checked on the real thing.

For each fixture folder and probe configuration (behaviour x TP size x TP rank), `doctor --json` runs
with the matching target (vllm==0.32.0 for the installed behaviour, vllm==0.22.1 for the 0.21-0.24 one,
`--tp` the same size) and its `runtime_stops_at` entry for that rank must be vLLM's exception,
`f"{error_type}: {error}"`, exactly. Two documented allowances:

* vLLM's bare `assert`s have an empty message; doctor names the check instead
  ("AssertionError: (no message) shape check in F fails"). There the error type must match and F must
  be the innermost function of vLLM's own traceback (the probe runs with --traceback).
* a message ending in a Python set with several members (vLLM prints a set, whose order varies) is
  compared as head + set.

A prediction that a rank loads must load in vLLM, and vice versa. With weights tracking on (the probe's
default) vLLM also reports parameters no tensor initialised (`ValueError: Following weights were not
initialized from checkpoint: {...}`); vLLM skips that check for quantized drafts by default and then
loads silently, so doctor predicts no stop there and reports `missing-input-scale` (or `silent-garbage`)
findings instead: the modules vLLM names must be exactly the ones doctor flags, and the folders also
load with tracking off (the runtime's default). Silent garbage: vLLM loads but the loaded bytes differ
from what the correct checkpoint gives, and doctor says so for that module and rank.

Fixtures (all built here): tiny assistants written with the project's codec (repair.demo.examples) and
edited to carry exactly one defect each, the real buggy ModelOpt export of a tiny assistant
(tests/conftest.py `broken_export`) and its `fix --target` outputs, and the real 31B assistant shapes
(the buggy export, its fix outputs, and two variants that hard-link its shards and change only the config).
"""

from __future__ import annotations

import pytest

from .doctor_cases import (
    DOWN0,
    SEED_TP1,
    SEED_TP2,
    assert_doctor_matches,
    cases,
    doctor,
    findings,
    marks_of,
    param_id,
    stop_at,
    vllm_message,
)
from .probe import VLLM_OWN_PARAMS, Run, assert_params_match, expected_buffers, expected_params, innermost_function, needs_legacy, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


# --------------------------------------------------------------------------------------------------------
# every folder, every configuration: doctor's per-rank prediction is what vLLM does
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,run", cases())
def test_doctor_predicts_what_vllm_does(probe, folders, name, run):
    res = probe(name, *run)
    assert_doctor_matches(doctor(folders[name], run.behaviour, run.tp_size), res, run.tp_rank)


# --------------------------------------------------------------------------------------------------------
# the seed reports: the buggy ModelOpt-style export
# --------------------------------------------------------------------------------------------------------
@needs_legacy
@pytest.mark.parametrize("name,tp1,tp2_rank1", [
    ("r31_broken", SEED_TP1, SEED_TP2),
    ("broken", "RuntimeError: start (0) + length (128) exceeds dimension size (64).",
     "RuntimeError: start (64) + length (64) exceeds dimension size (64)."),
    ("mo_broken", "RuntimeError: start (0) + length (128) exceeds dimension size (64).",
     "RuntimeError: start (64) + length (64) exceeds dimension size (64)."),
])
def test_buggy_export_fails_legacy_with_the_seed_errors(probe, folders, name, tp1, tp2_rank1):
    """vLLM 0.21-0.24 (seed: 0.22 TP=1, 0.23 TP=2): the narrow errors of layer 0's down_proj, verbatim."""
    assert vllm_message(probe(name, "legacy")) == tp1
    assert stop_at(doctor(folders[name], "legacy"), 0) == {"rank": 0, "tensor": f"{DOWN0}.weight", "error": tp1}
    assert vllm_message(probe(name, "legacy", 2, 1)) == tp2_rank1
    report = doctor(folders[name], "legacy", 2)
    assert stop_at(report, 1) == {"rank": 1, "tensor": f"{DOWN0}.weight", "error": tp2_rank1}
    # the seed's other TP=2 message, "AssertionError: param_data.shape == loaded_weight.shape", is the bare
    # assert of load_merged_column_weight (its source line; str() is empty): rank 0's half of the packed
    # down_proj fits, layer 0's packed gate_proj then fails the shape check
    res = probe(name, "legacy", 2, 0)
    assert (res["error_type"], res["error"]) == ("AssertionError", "")
    assert innermost_function(res["traceback"]) == "load_merged_column_weight"
    assert "assert param_data.shape == loaded_weight.shape" in res["traceback"]
    assert stop_at(report, 0) == {
        "rank": 0, "tensor": "model.layers.0.mlp.gate_proj.weight",
        "error": "AssertionError: (no message) shape check in load_merged_column_weight fails"}


@pytest.mark.parametrize("name", ["broken", "mo_broken", "r31_broken"])
@pytest.mark.parametrize("tp,rank", [(1, 0), (2, 1)])
def test_buggy_export_loads_installed_as_declared(probe, folders, name, tp, rank):
    """vLLM >= 0.25 follows the draft's config, which declares the packed handshake layers NVFP4: it loads
    (doctor: no stop, only the handshake-quantized warning), byte for byte. What fails there is the
    half-done repair (config excludes them, tensors still packed): see test_defect_class_messages."""
    res = probe(name, "installed", tp, rank)
    report = doctor(folders[name], "installed", tp)
    assert stop_at(report, rank) is None and res["ok"], res.get("error")
    assert set(findings(report, "handshake-quantized")) == {"pre_projection", "post_projection"}
    assert res["params"]["model.pre_projection.weight"]["dtype"] == "uint8"
    assert_params_match(res, expected_params(folders[name], tp, rank), ignore=VLLM_OWN_PARAMS,
                        buffers=expected_buffers(folders[name]) if tp == 1 else None)


# --------------------------------------------------------------------------------------------------------
# fix --target T: the output loads in T's behaviour, with exactly the output files' tensors
# --------------------------------------------------------------------------------------------------------
FIXED = [
    ("mo_fix_025", "installed", 1, 0), ("mo_fix_025", "installed", 2, 1),
    ("r31_fix_025", "installed", 1, 0), ("r31_fix_025", "installed", 2, 1),
    ("mo_fix_022", "legacy", 1, 0), ("mo_fix_022", "legacy", 2, 1), ("mo_fix_022", "legacy", 2, 0),
    ("mo_fix_bf16", "legacy", 1, 0), ("mo_fix_bf16", "legacy", 2, 1), ("mo_fix_bf16", "legacy", 2, 0),
    ("r31_fix_022", "legacy", 1, 0), ("r31_fix_022", "legacy", 2, 1),
]


@pytest.mark.parametrize("name,behaviour,tp,rank", [
    pytest.param(*c, id=param_id(c[0], Run(*c[1:])), marks=marks_of(Run(*c[1:]))) for c in FIXED])
def test_fix_output_loads_with_its_own_bytes(probe, folders, name, behaviour, tp, rank):
    report = doctor(folders[name], behaviour, tp)
    assert report["runtime_stops_at"] == [] and report["exit_code"] == 0, report["findings"]
    res = probe(name, behaviour, tp, rank)
    assert_params_match(res, expected_params(folders[name], tp, rank), ignore=VLLM_OWN_PARAMS,
                        buffers=expected_buffers(folders[name]) if tp == 1 else None)
    dtypes = {p["dtype"] for n, p in res["params"].items() if n.endswith(("_proj.weight", "_projection.weight"))}
    assert dtypes == ({"bfloat16"} if behaviour == "legacy" else {"bfloat16", "uint8"})


@needs_legacy
def test_fix_for_025_still_fails_legacy(probe, folders):
    """The 0.25 repair keeps NVFP4 layers, which 0.21-0.24 cannot load; doctor says which target to pick."""
    res = probe("mo_fix_025", "legacy")
    assert vllm_message(res) == "RuntimeError: start (0) + length (128) exceeds dimension size (64)."
    assert stop_at(doctor(folders["mo_fix_025"], "legacy"), 0)["error"] == vllm_message(res)


