"""Attacks on `load-refused` (#26 wave 2): the ways a user meets an architecture the target release loads no
checkpoint of, beyond the plain `doctor --target vllm==0.32.0`. vLLM's own load fails on every rank, so where doctor
says where each rank stops (`runtime_stops_at`, the text's "would stop", the side-by-side verdict), it says this."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_captured
from tests.hub_workflow_helpers import hub, hub_env  # noqa: F401 - fixtures
from tests.test_doctor_load_refused import DBRX, DBRX_ERROR, write_dbrx


@pytest.fixture(scope="module")
def dbrx(tmp_path_factory) -> Path:
    return write_dbrx(tmp_path_factory.mktemp("dbrx-attack") / "nvfp4", quantized=True)


def doctor_json(capsys, folder: Path, *args: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_every_rank_stops_with_vllms_error(dbrx, capsys):
    """vLLM's load_weights raises on every rank: doctor --json must not say no rank stops."""
    code, found = doctor_json(capsys, dbrx, "--target", "vllm==0.32.0", "--tp", "2")
    assert code == 1
    assert [(s["rank"], s["error"]) for s in found["runtime_stops_at"]] == [(0, DBRX_ERROR), (1, DBRX_ERROR)], found


def test_the_text_says_where_the_runtime_stops(dbrx, capsys):
    code, out, err = run_captured(capsys, "doctor", dbrx, "--target", "vllm==0.32.0")
    assert code == 1 and f"the runtime would stop at DbrxForCausalLM with:\n    {DBRX_ERROR}" in out, out + err


def test_side_by_side_says_vllm_does_not_load_it_and_sglang_has_no_such_stop(dbrx, capsys):
    code, out, err = run_captured(capsys, "doctor", dbrx, "--target", "vllm==0.32.0,sglang==0.5.23")
    verdicts = dict(line.split(None, 1) for line in out.splitlines()[1:3])
    assert "does not load (stops at DbrxForCausalLM)" in verdicts["vllm==0.32.0"], out
    assert "does not load" not in verdicts["sglang==0.5.23"], out
    code, found = doctor_json(capsys, dbrx, "--target", "vllm==0.32.0,sglang==0.5.23")
    stops = {t["target"]: t["runtime_stops_at"] for t in found["targets"]}
    assert stops["sglang==0.5.23"] == [] and [s["error"] for s in stops["vllm==0.32.0"]] == [DBRX_ERROR], stops


def test_hub_doctor_and_fix_say_what_the_local_ones_do(dbrx, hub, capsys, tmp_path):
    """The same checkpoint on the Hub (the local server, the real huggingface_hub client): the same verdict, and
    `hub fix` refuses in one line before creating anything."""
    hub.add_repo("alice/dbrx", dbrx)
    remote = doctor_json(capsys, "alice/dbrx", "--target", "vllm==0.32.0", "--tp", "2")
    local = doctor_json(capsys, dbrx, "--target", "vllm==0.32.0", "--tp", "2")
    assert remote[0] == local[0] == 1 and remote[1]["findings"] == local[1]["findings"]
    assert remote[1]["runtime_stops_at"] == local[1]["runtime_stops_at"] != []
    code, out, err = run_captured(capsys, "hub", "fix", "alice/dbrx", "--to", "alice/dbrx-fixed", "--target", "vllm==0.32.0")
    [line] = [x for x in err.splitlines() if x.startswith("error:")]  # after hub fix's progress lines (source, token)
    assert code == 2 and DBRX_ERROR in line and "nothing was written" in line, out + err
    assert not [r for r in hub.requests if r.method in ("POST", "PUT", "DELETE")], "a refusal created or uploaded something"


def test_the_web_check_shows_the_stop_and_the_refused_plan(dbrx):
    """The page's Check (repair.web.analyze, the library's doctor and plan): vLLM does not load it, where each rank
    stops, and the plan's one-line refusal; SGLang's verdict beside it has no such stop."""
    from repair.web.analyze import analyze

    answer = analyze({"source": str(dbrx), "target": "vllm==0.32.0,sglang==0.5.23", "tp": 2})
    verdicts = {v["target"]: v for v in answer["verdicts"]}
    assert verdicts["vllm==0.32.0"]["exit_code"] == 1
    assert [s["error"] for s in verdicts["vllm==0.32.0"]["stops"]] == [DBRX_ERROR, DBRX_ERROR]
    assert verdicts["sglang==0.5.23"]["stops"] == []
    assert any("[load-refused]" in line and "vllm==0.32.0" in line for line in answer["findings"]["error"]), answer["findings"]
    assert answer["plan_text"] is None and DBRX_ERROR in answer["plan_error"], answer["plan_error"]


def test_a_refused_architecture_listed_after_one_vllm_does_not_know(tmp_path, capsys):
    """config.json listing a name no vLLM registers before DbrxForCausalLM: vLLM skips it and builds DBRX."""
    folder = write_dbrx(tmp_path / "two", quantized=True, config=dict(DBRX, architectures=["NotARealForCausalLM", "DbrxForCausalLM"]))
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.32.0")
    assert code == 1 and [f["runtime_error"] for f in found["findings"] if f["code"] == "load-refused"] == [DBRX_ERROR]


def test_a_refused_architecture_listed_first_among_several(tmp_path, capsys):
    folder = write_dbrx(tmp_path / "two", quantized=True, config=dict(DBRX, architectures=["DbrxForCausalLM", "LlamaForCausalLM"]))
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.32.0")
    assert code == 1 and [f["runtime_error"] for f in found["findings"] if f["code"] == "load-refused"] == [DBRX_ERROR]


@pytest.mark.parametrize("name", ["dbrxforcausallm", "DBRXForCausalLM", " DbrxForCausalLM"])
def test_a_name_vllm_does_not_register_is_not_called_refused(tmp_path, capsys, name):
    """vLLM's registry is case- and space-sensitive: such a name never reaches dbrx.py, so its KeyError is not claimed."""
    folder = write_dbrx(tmp_path / "odd", quantized=True, config=dict(DBRX, architectures=[name]))
    assert not [f for f in doctor_json(capsys, folder, "--target", "vllm==0.32.0")[1]["findings"] if f["code"] == "load-refused"]


@pytest.mark.parametrize("target,release", [("vllm==0.29.5", "vllm 0.28.0"), ("vllm==0.33.0", "vllm 0.32.0"),
                                            ("VLLM == 0.32.0rc1", "vllm 0.32.0")])
def test_an_unprofiled_release_takes_the_rows_at_or_below_it_and_says_whose(dbrx, capsys, target, release):
    """Between or past the profiled releases, the fact is the profile at or below it, named as such (as every other
    row is), never the target's own words."""
    code, found = doctor_json(capsys, dbrx, "--target", target)
    [f] = [f for f in found["findings"] + found["notes"] if f["code"] == "load-refused"]  # past 0.32: a note
    assert f["message"].startswith(f"DbrxForCausalLM: {release}'s load_weights fails"), f["message"]


def test_hub_fix_past_every_profile_says_the_note_it_does_not_refuse(dbrx, hub, capsys):
    """`hub fix --target vllm==0.33.0` is not refused for DBRX (nothing to fix here, and a dry run with bf16 too),
    but says doctor's load-refused note, as the local fix does, and uploads nothing for the noop."""
    hub.add_repo("alice/dbrx", dbrx)
    for target, more in (("vllm==0.33.0", ()), ("vllm==0.33.0,bf16", ("--dry-run",))):
        code, out, err = run_captured(capsys, "hub", "fix", "alice/dbrx", "--to", "alice/dbrx-fixed", "--target", target, *more)
        assert code == 0, err
        said = out + err
        assert said.count(DBRX_ERROR) == 1 and "note for vllm==0.33.0: [load-refused] DbrxForCausalLM" in said, said
    assert not [r for r in hub.requests if r.method in ("POST", "PUT", "DELETE")], "a noop or dry run uploaded something"
