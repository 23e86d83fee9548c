"""CLI surface: inspect --json, dry-run, progress in bytes, python -m repair, the report's contents."""

from __future__ import annotations

import json
import subprocess
import sys

from repair.demo.examples import TINY, write_assistant
from repair.execute.writer import execute
from repair.io.checkpoint import open_checkpoint
from repair.planning.build import make_plan
from repair.planning.recipe import Recipe
from tests.conftest import run_cli, tree_hashes


def test_inspect_json_reports_precision_shapes_and_bits(tmp_path, capsys):
    src = write_assistant(tmp_path / "b", TINY)
    capsys.readouterr()
    assert run_cli("inspect", src, "--json") == 0
    data = json.loads(capsys.readouterr().out)
    pre = next(m for m in data["modules"] if m["name"] == "pre_projection")
    assert pre == {**pre, "precision": "nvfp4", "stored_shape": [64, 96], "logical_shape": [64, 192], "expected_shape": [64, 192], "declared": "quantized"}
    assert set(pre["tensors"]) == {f"pre_projection.{t}" for t in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
    assert 4.5 < data["bits_per_parameter"] < 6 and data["declaration"]["config_json_ignore"] == ["lm_head"]


def test_dry_run_writes_nothing_and_prints_the_plan(tmp_path, capsys):
    src = write_assistant(tmp_path / "b", TINY)
    capsys.readouterr()
    assert run_cli("fix", src, "-o", tmp_path / "out", "--dry-run", "--json") == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert not (tmp_path / "out").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["b"]
    assert {c["module"] for c in plan["changes"]} == {"pre_projection", "post_projection"}
    assert {f["name"]: f["op"] for f in plan["files"]}["model.safetensors"] == "rewrite"


def test_progress_bar_counts_bytes(tmp_path, capsys):
    src = write_assistant(tmp_path / "b", TINY)
    capsys.readouterr()
    execute(make_plan(open_checkpoint(src), Recipe()), tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    assert "repair" in err and "B/s" in err


def test_report_records_hashes_changes_and_version(tmp_path):
    src = write_assistant(tmp_path / "b", TINY)
    assert run_cli("fix", src, "-o", tmp_path / "out", "--quiet") == 0
    report = json.loads((tmp_path / "out/repair_report.json").read_text())
    sources = {f["name"]: f["sha256"] for f in report["source"]["files"]}
    assert sources == tree_hashes(src)
    outputs = {f["name"]: f["sha256"] for f in report["outputs"]}
    assert outputs == {k: v for k, v in tree_hashes(tmp_path / "out").items() if k != "repair_report.json"}
    pre = next(c for c in report["changes"] if c["module"] == "pre_projection")
    assert pre["after"] == [{"name": "pre_projection.weight", "dtype": "BF16", "shape": [64, 192]}]
    assert {t["name"] for t in pre["before"]} == {f"pre_projection.{t}" for t in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
    assert report["tool"]["name"] == "ckpt-repair" and report["tool"]["version"]


def test_python_dash_m_and_bad_input_is_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "repair", "inspect", str(tmp_path / "missing")], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "not a folder" in done.stderr and "Traceback" not in done.stderr
