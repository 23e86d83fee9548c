"""`fix --tp N` with an N the input allows but the machine or the layout does not: a checkpoint whose every tensor is
replicated (no parallel plan known) passes every divisibility rule for any N. Each such N is one line, before anything
is written: exit 2 naming the bound, never a traceback (`can't start new thread`, `Too many open files` blamed on the
disk) nor an exit 3 from our own self-check. The hashing threads are bounded by the machine, not by N."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from repair.execute.copies import COPIERS
from repair.tp.manifest import MAX_TP
from tests.conftest import run_captured, run_cli

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def replicated(tmp_path_factory) -> Path:
    """An export of a model type with no parallel plan: every tensor replicated, so every --tp passes the rules."""
    src = write_assistant(tmp_path_factory.mktemp("tp-limits") / "src", TINY)
    config = json.loads((src / "config.json").read_text())
    config.update(architectures=["UnheardOfForCausalLM"], model_type="unheard_of")
    config["text_config"]["model_type"] = "unheard_of_text"
    (src / "config.json").write_text(json.dumps(config))
    return src


def _one_line(code: int, err: str, expected: int = 2) -> None:
    assert code == expected and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


def test_a_degree_past_what_unshard_reads_back_is_refused_before_anything_is_written(replicated, tmp_path, capsys):
    """Before: 4097 rank folders written, then exit 3 (our own manifest failed our own reader's bound)."""
    code, _, err = run_captured(capsys, "fix", replicated, "-o", tmp_path / "out", "--tp", str(MAX_TP + 1), "--quiet")
    _one_line(code, err)
    assert f"--tp {MAX_TP + 1}" in err and f"at most {MAX_TP}" in err, err
    assert list(tmp_path.iterdir()) == []


def test_more_rank_files_than_the_process_may_open_is_refused_naming_the_limit(replicated, tmp_path):
    """Every rank file is open at once: past `ulimit -n` (hard: it cannot be raised), one line saying so, not a
    `Too many open files; check the disk` after minutes of writing."""
    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    run = subprocess.run([sys.executable, "-m", "repair", "fix", str(replicated), "-o", str(tmp_path / "out"), "--tp", "100",
                          "--quiet"], capture_output=True, text=True, cwd=ROOT, preexec_fn=low_limit, timeout=300)
    _one_line(run.returncode, run.stderr)
    assert "--tp 100" in run.stderr and "ulimit -n" in run.stderr and "64" in run.stderr, run.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_soft_open_file_limit_below_the_ranks_is_raised_to_the_hard_one(replicated, tmp_path):
    def low_soft():
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    run = subprocess.run([sys.executable, "-m", "repair", "fix", str(replicated), "-o", str(tmp_path / "out"), "--tp", "100",
                          "--quiet"], capture_output=True, text=True, cwd=ROOT, preexec_fn=low_soft, timeout=300)
    assert run.returncode == 0, run.stderr
    assert len(list((tmp_path / "out").glob("rank-*"))) == 100


def test_the_hashing_threads_are_bounded_by_the_machine_not_by_tp(replicated, tmp_path, monkeypatch):
    """Before: one sha256 thread per rank file (4096 for --tp 4096: past what a container allows, a traceback)."""
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    peak, real_start = [0], threading.Thread.start

    def counted(self):
        real_start(self)
        peak[0] = max(peak[0], sum(t.name.startswith("sha256") for t in threading.enumerate()))
    monkeypatch.setattr(threading.Thread, "start", counted)
    assert run_cli("fix", replicated, "-o", tmp_path / "out", "--tp", "32", "--quiet") == 0
    monkeypatch.undo()
    # the rank files' (2 here), the small files' copiers' and the input shard's own digest (tp/source_digests.py)
    assert peak[0] <= 2 + COPIERS + 1, f"{peak[0]} hashing threads at once for 32 ranks"
    assert run_cli("unshard", tmp_path / "out", "-o", tmp_path / "back") == 0
    assert run_cli("fix", replicated, "-o", tmp_path / "plain", "--quiet") == 0
    same = sorted(p.name for p in (tmp_path / "plain").iterdir() if p.name != "repair_report.json")
    assert all((tmp_path / "back" / n).read_bytes() == (tmp_path / "plain" / n).read_bytes() for n in same)


@pytest.mark.parametrize("failure", [RuntimeError("can't start new thread"), MemoryError()], ids=["thread", "memory"])
def test_a_thread_the_system_refuses_is_one_line_and_nothing_is_written(failure, replicated, tmp_path, capsys, monkeypatch):
    """The system out of threads or memory as a thread starts (a container's pids limit): one line saying what ran out
    and what to do, exit 2 (the machine's state, not the input's and not our bug), no OUT, no temp folder."""
    real_start, count = threading.Thread.start, [0]

    def refused(self):
        count[0] += 1
        if count[0] > 3:
            raise failure
        return real_start(self)
    monkeypatch.setattr(threading.Thread, "start", refused)
    code, _, err = run_captured(capsys, "fix", replicated, "-o", tmp_path / "out", "--tp", "8", "--quiet")
    monkeypatch.undo()
    _one_line(code, err)
    assert "nothing was written" in err and ("thread" in err or "memory" in err), err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["text", "json"])
def test_doctor_refuses_a_degree_past_the_bound_before_simulating_any_rank(command, replicated, capsys):
    """doctor simulates each rank (a tuple of ranks per finding): `--tp 100000000` was a MemoryError or minutes of
    allocation; one line naming the bound instead, at once."""
    extra = ["--json"] if command == "json" else []
    code, out, err = run_captured(capsys, "doctor", replicated, "--target", "vllm==0.32.0", "--tp", "100000000", *extra)
    _one_line(code, err)
    assert "--tp 100000000" in err and f"at most {MAX_TP}" in err and out == "", err


SLOW_HASHING = """
import resource, sys, time
from repair.io import hasher
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1])))
Queue = hasher.queue.SimpleQueue
class Slow:
    def __init__(self):
        self.queue = Queue()
    def put(self, item):
        self.queue.put(item)
    def get(self):
        time.sleep(0.001)  # the hashing lags behind the copies (a busy machine)
        return self.queue.get()
hasher.queue = type("queue", (), {"SimpleQueue": Slow})
from repair.cli.main import main
main(sys.argv[2:])
"""


def test_a_degree_the_open_file_check_accepts_never_runs_out_of_files_while_hashing_lags(replicated, tmp_path):
    """The check counts every file the run holds at once. Each copied chunk waiting for its hashing holds a mapping of
    the output, and CPython's mmap holds a file descriptor of its own (a dup): before, hashing that lagged behind the
    copies (the machine busy, thousands of small replicated tensors) ran out of descriptors the check had not counted
    and said `Too many open files; check the disk` after writing, with a limit the check had accepted."""
    def fix(limit: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", SLOW_HASHING, str(limit), "fix", str(replicated), "-o", str(tmp_path / "out"),
                               "--tp", "100", "--quiet"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    refused = fix(64)
    _one_line(refused.returncode, refused.stderr)
    others = int(refused.stderr.split(" beside ")[1].split()[0])
    accepted = fix(100 + others)
    assert accepted.returncode == 0, accepted.stderr
    assert len(list((tmp_path / "out").glob("rank-*"))) == 100


def test_unshard_of_more_rank_files_than_the_process_may_open_is_one_line(replicated, tmp_path):
    """unshard holds every rank file open at once (pinned: read through the handles it checked): a `fix --tp 100`
    output holds 400 of them. Under a hard `ulimit -n` below that, before: an OSError traceback."""
    assert run_cli("fix", replicated, "-o", tmp_path / "tp", "--tp", "100", "--quiet") == 0

    def low_limit():
        resource.setrlimit(resource.RLIMIT_NOFILE, (200, 200))
    run = subprocess.run([sys.executable, "-m", "repair", "unshard", str(tmp_path / "tp"), "-o", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=ROOT, preexec_fn=low_limit, timeout=300)
    _one_line(run.returncode, run.stderr)
    assert "ulimit -n" in run.stderr and "200" in run.stderr, run.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tp"]
