"""`hub fix --target a,b` (#28.3): one fork commit whose output every target passes, equal to a local `fix` with
the same targets; the result, the report and the fork's card show each target's verdict."""

from __future__ import annotations

import json

from tests.hub_workflow_helpers import SRC, assert_equals_local_fix, hub, hub_env, run  # noqa: F401 - fixtures

TARGETS = "vllm==0.32.0,vllm==0.22.1"


def test_hub_fix_for_two_targets_equals_the_local_fix_and_shows_both_verdicts(hub, broken, capsys, tmp_path):
    sha = hub.add_repo(SRC, broken)
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--target", TARGETS, "--json")
    assert code == 0, err
    result = json.loads(out)
    assert [v["target"] for v in result["doctor_after"]["targets"]] == TARGETS.split(",")
    assert all(v["exit_code"] == 0 and not v["findings"] for v in result["doctor_after"]["targets"])
    local = tmp_path / "local"
    assert run(capsys, "fix", broken, "-o", local, "--target", TARGETS, "--quiet")[0] == 0
    assert_equals_local_fix(hub.repo_files("alice/fixed"), local, f"{SRC}@{sha}")
    report = json.loads(hub.repo_files("alice/fixed")["repair_report.json"])
    assert [r["target"] for r in report["doctor"]["targets"]] == TARGETS.split(",")
    card = hub.repo_files("alice/fixed")["README.md"].decode()
    assert f"--target {TARGETS}" in card and "2 targets, tensor parallel 1: 2 clean, 0 with problems" in card
    assert "2 targets, tensor parallel 1: 0 clean, 2 with problems" in card  # before


def test_hub_fix_text_says_the_verdict_after_per_target(hub, broken, capsys):
    hub.add_repo(SRC, broken)
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--target", TARGETS, "--quiet")
    assert code == 0, err
    assert [line for line in out.splitlines() if line.startswith("doctor after")] == [
        f"doctor after: 0 finding(s) for {t}" for t in TARGETS.split(",")]
