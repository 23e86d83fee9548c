"""Same input and options -> byte-identical output, and every written file is checked and hashed.

Covers every output file including repair_report.json (it carries no timestamp), across runs
in one process and in a fresh process with another hash seed, and the self-check that refuses
to publish a folder whose files do not match the plan.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import repair.execute.writer as ex
from tests.test_reliability_corpus import assert_one_error_line, tree
from tools.malformed import SHARDS
from tests.conftest import run_cli

OPTIONS = [pytest.param((), id="default"), pytest.param(("--target", "bf16"), id="target-bf16")]


def fix(src: Path, out: Path, *extra: str) -> int:
    return run_cli("fix", src, "-o", out, "--quiet", *extra)


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> dict[str, Path]:
    from repair.demo.examples import TINY, write_assistant

    root = tmp_path_factory.mktemp("determinism")
    return {"single": write_assistant(root / "single", TINY), "sharded": write_assistant(root / "sharded", TINY, shards=SHARDS)}


@pytest.mark.parametrize("layout", ["single", "sharded"])
@pytest.mark.parametrize("options", OPTIONS)
def test_two_runs_write_identical_bytes(sources, layout, options, tmp_path):
    src = sources[layout]
    assert fix(src, tmp_path / "a", *options) == 0
    assert fix(src, tmp_path / "b", *options) == 0
    first, second = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert "repair_report.json" in first and first == second


def test_a_fresh_process_with_another_hash_seed_writes_identical_bytes(sources, tmp_path):
    src = sources["sharded"]
    assert fix(src, tmp_path / "here") == 0
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-m", "repair", "fix", str(src), "-o", str(tmp_path / "there"), "--quiet"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert tree(tmp_path / "here") == tree(tmp_path / "there")


def test_report_has_no_timestamp_and_hashes_every_output_file(sources, tmp_path):
    out = tmp_path / "out"
    assert fix(sources["sharded"], out) == 0
    report = json.loads((out / "repair_report.json").read_text())
    text = json.dumps(report)
    assert not any(key in text for key in ('"time', '"date', '"created', '"started', "timestamp")), "report has a timestamp"
    files = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()} - {"repair_report.json"}
    recorded = {o["name"]: o["sha256"] for o in report["outputs"]}
    assert set(recorded) == files
    for name, digest in recorded.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == digest, name
    assert str(out) not in text and ".partial-" not in text, "the report depends on where it was written"


def test_output_contains_no_marker_or_temp_files(sources, tmp_path):
    out = tmp_path / "out"
    assert fix(sources["single"], out) == 0
    assert not [p.name for p in out.rglob(".*")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


# --- the self-check refuses to publish what does not match the plan ------------------------------

def assert_refused(src: Path, out: Path, capsys, expect: str) -> None:
    """A failed check of our own output: an internal error (exit 3) that says nothing was published."""
    before = tree(src)
    assert fix(src, out) == 3
    line = assert_one_error_line(capsys.readouterr().err, expect)
    assert "internal error" in line and "nothing was published" in line
    assert not out.exists() and [p.name for p in out.parent.iterdir() if ".partial-" in p.name] == []
    assert tree(src) == before


def test_self_check_catches_a_shard_that_lost_bytes(sources, tmp_path, monkeypatch, capsys):
    from repair.execute.copies import WholeCopies

    real, out = WholeCopies.digest, tmp_path / "out"

    def lossy(self, name):
        digest = real(self, name)  # copied and hashed: then the file loses its tail
        dst = next(out.parent.glob(f".{out.name}.partial-*")) / name
        os.truncate(dst, os.path.getsize(dst) - 64)  # as a failing disk or a full quota might
        return digest

    monkeypatch.setattr(WholeCopies, "digest", lossy)
    assert_refused(sources["sharded"], out, capsys, "model-00001-of-00003.safetensors: does not re-open")


def test_self_check_catches_a_header_that_differs_from_the_plan(sources, tmp_path, monkeypatch, capsys):
    real = ex.ShardWriter.__init__

    def wrong_metadata(self, path, tensors, metadata, source=None):
        real(self, path, tensors, {"format": "np"}, source)

    monkeypatch.setattr(ex.ShardWriter, "__init__", wrong_metadata)
    assert_refused(sources["single"], tmp_path / "out", capsys, "model.safetensors: written header does not match the plan")


def test_shard_writer_refuses_bytes_that_do_not_fit_the_planned_header(sources, tmp_path, monkeypatch, capsys):
    """A tensor's bytes that disagree with the header written first: our bug, exit 3, nothing published."""
    real = ex.ShardWriter.write

    def short(self, name, data):
        real(self, name, memoryview(data).cast("B")[:-1])

    monkeypatch.setattr(ex.ShardWriter, "write", short)
    assert_refused(sources["single"], tmp_path / "out", capsys, "the shard writer's check of the planned header failed")


def test_self_check_catches_a_stray_file(sources, tmp_path, monkeypatch, capsys):
    real = ex._write_all

    def with_stray(plan, tmp, bar, *rest):
        hashes = real(plan, tmp, bar, *rest)
        (tmp / "stray.bin").write_bytes(b"?")
        return hashes

    monkeypatch.setattr(ex, "_write_all", with_stray)
    assert_refused(sources["single"], tmp_path / "out", capsys, "differ from the plan")


def test_self_check_catches_rewritten_json_that_differs(sources, tmp_path, monkeypatch, capsys):
    real = ex.write_json

    def drop_keys(path, content):
        return real(path, {} if path.name == "config.json" else content)

    monkeypatch.setattr(ex, "write_json", drop_keys)
    assert_refused(sources["single"], tmp_path / "out", capsys, "config.json: written JSON does not match the plan")
