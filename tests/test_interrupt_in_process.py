"""Ctrl-C or SIGTERM at any point of a multi-shard fix, in-process: the run says so (exit 130), and it leaves no temp
folder beside OUT, no thread it started and no file it opened under the output's folder.

The signal is real (signal.raise_signal), raised just before one step of the writer runs: on the main thread, or on
a copier thread (the kernel may hand a process's signal to any thread; Python runs the handler on the main one). The
bar is shown or not: tqdm's bar starts a monitor thread of its own.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest

import repair.execute.copies as copies
import repair.execute.writer as writer
import repair.io.atomic as atomic
import repair.io.hasher as hasher_module
import repair.io.hashing as hashing
import repair.io.shard_writer as shard_writer
import repair.tp.rank_digests as rank_digests
import repair.tp.source_digests as source_digests
import repair.tp.unshard as unshard_module
import repair.tp.write as tp_write
from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured, run_cli

# the first shard rewritten (pre/post_projection), five kept whole: copies run ahead while the rewrite computes
SHARDS = [[f"model.layers.{i}.{part}."] for i in range(2) for part in ("self_attn", "mlp")] + [["model.norm."]]

POINTS = {  # where: (object, attribute) wrapped so the signal is raised as it is called
    "first_digest": (copies.WholeCopies, "digest"),
    "copier_thread": (copies, "copy_file_started"),
    "rewrite": (shard_writer.ShardWriter, "write"),
    "rewrite_opening": (shard_writer, "SourceDigest"),  # the rewritten shard's output file is open, `with` not entered
    "json_files": (writer, "write_json"),
    "self_check": (writer, "_self_check"),
    "fsync": (atomic, "fsync_tree"),
    "closing_a_file": (hashing.HashedOutput, "close"),  # waiting for a file's hashing (the rewrite's, a copied file's)
    "source_digest": (hashing.SourceDigest, "hexdigest"),  # waiting for an input shard's hashing (fix --tp: each shard's)
    "tp_json_files": (tp_write, "write_json"),  # fix --tp: each rank's config, the manifest, the report
}
ONE_FILE_ONLY = {"rewrite_opening", "self_check", "json_files"}
TP_ONLY = {"tp_json_files"}  # steps fix --tp has not (its small files are whole copies too)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("interrupt-in-process") / "src", TINY, shards=SHARDS)


def _files_open_under(folder: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            found.append(target)
    return found


def _threads_left(before: set[threading.Thread]) -> list[str]:
    """Threads started since `before` still alive after a while; but tqdm's monitor, one per process from its first
    bar on (tqdm 4.67 stops it at exit only, interrupted or not)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [t.name for t in threading.enumerate() if t not in before and t.is_alive() and t.name != "tqdm_monitor"]
        if not left:
            return []
        time.sleep(0.02)
    return left


@pytest.mark.parametrize("tp", [(), ("--tp", "2")], ids=["", "tp"])
@pytest.mark.parametrize("bar", [False, True], ids=["no-bar", "bar"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", sorted(POINTS))
def test_an_interrupt_at_any_step_leaves_no_temp_folder_thread_or_open_file(point, sig, bar, tp, src, tmp_path, capsys, monkeypatch):
    owner, attribute = POINTS[point]
    if tp and point in ONE_FILE_ONLY:
        pytest.skip("fix --tp writes rank files, not whole copies or a rewritten shard")
    if not tp and point in TP_ONLY:
        pytest.skip("a step of fix --tp only")
    real = getattr(owner, attribute)
    raised = []

    def interrupted(*args, **kwargs):
        if not raised:
            raised.append(threading.current_thread().name)
            signal.raise_signal(sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, interrupted)
    if bar:
        real_bar = writer.byte_bar
        for module in (writer, tp_write):
            monkeypatch.setattr(module, "byte_bar", lambda total, desc, show, **kw: real_bar(total, desc, True, **kw))
    before = set(threading.enumerate())
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--jobs", "2", *tp, *(() if bar else ("--quiet",)))
    assert raised, f"{point} was never reached"
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted; nothing was written", err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []
    assert _threads_left(before) == []
    assert _files_open_under(tmp_path) == []


OPENINGS = {  # command flags, the (module, name)s of the call, which call: the signal lands once the object exists
    # (its file open, its thread started) and before the run holds it to close (between a constructor's return and
    # `with` or `enter_context`)
    "tp_rank_0_file": (("--tp", "2"), [(tp_write, "ShardWriter")], 1),
    "tp_rank_1_file": (("--tp", "2"), [(tp_write, "ShardWriter")], 2),
    "tp_first_rank_hasher": (("--tp", "2"), [(hasher_module, "Hasher")], 1),  # the rank files' shared hashing threads
    "tp_second_rank_hasher": (("--tp", "2"), [(hasher_module, "Hasher")], 2),
    "tp_first_source_digest": (("--tp", "2"), [(source_digests, "SourceDigest")], 1),
    "tp_second_source_digest": (("--tp", "2"), [(source_digests, "SourceDigest")], 2),
    "rewritten_shard": ((), [(writer, "ShardWriter")], 1),
    "last_whole_copy": ((), [(hashing, "copy_file_started"), (copies, "copy_file_started")], "last"),  # a small file's
}


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", sorted(OPENINGS))
def test_an_interrupt_as_a_file_is_opened_leaves_no_thread_or_open_file(point, sig, src, tmp_path, capsys, monkeypatch):
    flags, calls, nth = OPENINGS[point]
    opened = []
    if nth == "last":  # count the calls of an uninterrupted run first
        for owner, attribute in calls:
            real = getattr(owner, attribute)
            monkeypatch.setattr(owner, attribute, lambda *a, real=real, **k: opened.append(1) or real(*a, **k))
        assert run_cli("fix", src, "-o", tmp_path / "count", "--quiet", *flags) == 0
        shutil.rmtree(tmp_path / "count")
        monkeypatch.undo()
        nth, opened = len(opened), []
    for owner, attribute in calls:
        def opened_then_interrupted(*args, real=getattr(owner, attribute), **kwargs):
            made = real(*args, **kwargs)
            opened.append(made)
            if len(opened) == nth:
                signal.raise_signal(sig)
            return made
        monkeypatch.setattr(owner, attribute, opened_then_interrupted)
    before = set(threading.enumerate())
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet", *flags)
    assert len(opened) >= nth
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted; nothing was written", err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []
    assert _threads_left(before) == []
    assert _files_open_under(tmp_path) == []


UNSHARD_POINTS = {  # where: (object, attribute, raised after the call returns instead of before)
    "shard_opened": (unshard_module, "HashedOutput", True),  # a rebuilt shard's file open, its `try` not entered yet
    "concat": (unshard_module, "_concat", False),
    "rank_hasher_started": (hasher_module, "Hasher", True),  # a rank files' hashing thread started, before the list holds it
    "rank_digests_checked": (rank_digests.RankDigests, "check", False),  # every rank file's hashing being finished
    "rank_digest_finished": (hashing.SourceDigest, "hexdigest", False),  # waiting for a rank file's hashing
    "small_file": (copies.WholeCopies, "digest", False),
    "small_file_opened": (hashing, "HashedOutput", True),  # a small file's copy open, before the copy holds it
    "small_file_copied": (copies, "copy_file_started", True),  # copied, before anything waits for its hashing
    "index_opened": (unshard_module, "HashedOutput", "last"),  # the index's file open, before it is written and closed
    "index_written": (hashing.HashedOutput, "write", "last"),  # the index's bytes being hashed
    "self_check": (unshard_module, "_self_check", False),
    "fsync": (atomic, "fsync_tree", False),
    "closing_a_file": (hashing.HashedOutput, "close", False),
}


@pytest.fixture(scope="module")
def tp_out(src, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("interrupt-unshard") / "tp"
    assert run_cli("fix", src, "-o", out, "--tp", "2", "--quiet") == 0
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("point", sorted(UNSHARD_POINTS))
def test_an_interrupt_at_any_step_of_unshard_leaves_no_temp_folder_thread_or_open_file(point, sig, tp_out, tmp_path, capsys, monkeypatch):
    owner, attribute, after = UNSHARD_POINTS[point]
    real = getattr(owner, attribute)
    calls, raised = [], []
    if after == "last":  # count the calls of an uninterrupted run first: the index is the last file unshard opens
        monkeypatch.setattr(owner, attribute, lambda *a, **k: calls.append(1) or real(*a, **k))
        assert run_cli("unshard", tp_out, "-o", tmp_path / "count") == 0
        shutil.rmtree(tmp_path / "count")
    last = len(calls)

    def interrupted(*args, **kwargs):
        calls.append(1)
        if after and not raised and (after is True or len(calls) == 2 * last):
            value = real(*args, **kwargs)
            raised.append(point)
            signal.raise_signal(sig)
            return value
        if not after and not raised:
            raised.append(point)
            signal.raise_signal(sig)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, attribute, interrupted)
    before = set(threading.enumerate())
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "unshard", tp_out, "-o", out)
    assert raised, f"{point} was never reached"
    assert code == 130 and err.strip().splitlines()[-1] == "interrupted; nothing was written", err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []
    assert _threads_left(before) == []
    assert _files_open_under(tmp_path) == []
