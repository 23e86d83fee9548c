"""`fix` killed at any point leaves no OUT that looks complete, and a re-run gives the same bytes.

The kills are real SIGKILLs of a `python -m repair fix` subprocess. To hit exact points without
any hook in the tool, the child patches one function of its own copy of the code to SIGKILL
itself when reached (see CHILD); one test also kills from outside at an unplanned moment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repair.demo.examples import AssistantDims, write_assistant
from repair.io.staging import MARKER
from tests.test_reliability_corpus import tree
from tests.conftest import run_captured, run_cli

# ~22 MB over three shards: big enough that the kill lands mid-write, small enough to be quick.
DIMS = AssistantDims(hidden=512, backbone=1024, intermediate=2048, layers=2, heads=4, head_dim=128, global_head_dim=256, vocab=16384)
SHARDS = [["pre_projection"], ["post_projection"]]  # shard 1 is copied whole, shards 2 and 3 rewritten

CHILD = r"""
import os, signal, sys
import repair.execute.writer as ex, repair.io.atomic as at, repair.io.staging as st
point, args = sys.argv[1], sys.argv[2:]

def die(*_a, **_k):
    os.kill(os.getpid(), signal.SIGKILL)

def then_die(fn):
    def wrapped(*a, **k):
        result = fn(*a, **k)
        die()
    return wrapped

if point == "temp_created":        # the temp folder holds only its marker
    ex._build = die
elif point == "mid_first_shard":   # first shard half copied
    real_write = os.write
    def write(fd, data):
        done = real_write(fd, data)
        if done >= 4 << 20:
            die()
        return done
    os.write = write
    real_copy = os.copy_file_range
    def copy_file_range(src, dst, count, offset_src=None, offset_dst=None):  # the kernel copy of whole shards
        real_copy(src, dst, min(count, 4 << 20), offset_src)
        die()
    os.copy_file_range = copy_file_range
elif point == "after_first_shard":  # first shard complete, nothing else
    import repair.execute.copies as cp
    cp.WholeCopies.digest = then_die(cp.WholeCopies.digest)
elif point == "mid_rewrite":        # second shard: header and copied tensors written, not the computed one
    import repair.io.shard_writer as sf
    sf.ShardWriter.write = die
elif point == "before_marker":      # the temp folder exists, its marker is not renamed in yet
    st.os.replace = die
elif point == "before_publish":     # everything written, checked and flushed; not yet renamed
    at.publish = die
elif point == "deleting_old_out":   # --overwrite: new OUT swapped in, old one half deleted
    import repair.io.output as out_mod
    def discard(folder):
        next(p for p in folder.iterdir() if p.name != st.MARKER).unlink()
        die()
    out_mod.discard = discard
elif point == "unmarked_before_swap":  # --overwrite: the temp folder's marker removed, OUT not yet exchanged
    import repair.io.output as out_mod
    out_mod._move_into_place = die
elif point == "just_exchanged":     # --overwrite: the exchange done, nothing after it
    import repair.io.output as out_mod
    real_rename2 = out_mod._rename2
    def rename2(a, b, flags):
        done = real_rename2(a, b, flags)
        if done and flags == out_mod._RENAME_EXCHANGE:
            die()
        return done
    out_mod._rename2 = rename2
elif point == "marking_old_out":    # --overwrite: the swapped-out OUT's marker staged, not yet renamed in
    import repair.io.output as out_mod
    import json, socket
    def mark(folder):  # mark()'s first step (write MARKER.new), and the kill before it is renamed in
        (folder / (st.MARKER + ".new")).write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
        die()
    out_mod.mark = mark
elif point == "old_out_marked":     # --overwrite: the swapped-out OUT marked, not yet deleted
    import repair.io.output as out_mod
    out_mod.mark = then_die(out_mod.mark)
elif point == "term_temp_created":  # SIGTERM the instant the marked temp folder exists, before its name is returned
    import repair.io.output as out_mod
    real_new = out_mod.new_partial
    def new_partial(out):
        tmp = real_new(out)
        os.kill(os.getpid(), signal.SIGTERM)
        return tmp
    out_mod.new_partial = new_partial
elif point == "term_thread_after_rename":  # SIGTERM to another thread (as the kernel may pick) right after the rename
    import threading, repair.io.output as out_mod
    go, sent = threading.Event(), threading.Event()
    def signal_self():  # started now, before any mask: like tqdm's monitor or a hashing thread
        go.wait()
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        sent.set()
    threading.Thread(target=signal_self, daemon=True).start()
    real_move = out_mod._move_into_place
    def move(*a, **k):
        old = real_move(*a, **k)
        go.set(); sent.wait()
        return old
    out_mod._move_into_place = move
elif point == "term_twice_as_cleanup_starts":  # a second SIGTERM as staged()'s cleanup starts, before held() holds it
    import repair.io.staging as st
    def build(*a, **k):
        os.kill(os.getpid(), signal.SIGTERM)
    ex._build = build
    real_held = st.InterruptGate.held
    def held(self):
        if sys.exc_info()[0] is KeyboardInterrupt:
            os.kill(os.getpid(), signal.SIGTERM)
        return real_held(self)
    st.InterruptGate.held = held
elif point == "int_after_publish":  # Ctrl-C once OUT is published and the interrupt handlers are restored
    import repair.cli.fix_cmd as fix_cmd
    real_summary = fix_cmd._summary
    def summary(*a, **k):
        os.kill(os.getpid(), signal.SIGINT)
        return real_summary(*a, **k)
    fix_cmd._summary = summary
from repair.cli import main
main(args)
"""

PARTIAL = re.compile(r"\.out\.partial-(\d+)-\w+")


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("interrupt") / "src", DIMS, shards=SHARDS)


@pytest.fixture(scope="module")
def reference(src, tmp_path_factory) -> dict[str, str]:
    """The uninterrupted output's file hashes."""
    out = tmp_path_factory.mktemp("reference") / "out"
    assert fix(src, out) == 0
    return tree(out)


def fix(src: Path, out: Path, *extra: str) -> int:
    return run_cli("fix", src, "-o", out, "--quiet", *extra)


def killed_child(point: str, src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    args = ["fix", str(src), "-o", str(out), "--quiet", *extra]
    return subprocess.run([sys.executable, "-c", CHILD, point, *args], capture_output=True, text=True, timeout=120)


def partials(out: Path) -> list[Path]:
    """Hidden entries a run left beside OUT, but the lock file: a killed run leaves it holding no lock,
    and the next run takes it over and removes it (see assert_no_lock_left)."""
    return sorted(p for p in out.parent.iterdir() if p.name.startswith(".out.") and p.name != ".out.lock")


def assert_no_lock_left(out: Path) -> None:
    assert not (out.parent / ".out.lock").exists(), "a finished run left its lock file"


def wait_until_writing(child: subprocess.Popen, out: Path) -> None:
    """Until the child's temp folder (with its marker) exists, or the child is done."""
    deadline = time.monotonic() + 60
    while child.poll() is None and not any((p / MARKER).exists() for p in partials(out)) and time.monotonic() < deadline:
        time.sleep(0.001)


def assert_nothing_looks_complete(out: Path, reference: dict[str, str]) -> None:
    """OUT is absent or exactly the finished output; anything else is a hidden temp folder, marked or (killed
    as it was being published: the marker goes just before the rename) a whole output its report proves ours."""
    from repair.io.ownership import is_ours

    if out.exists():
        assert tree(out) == reference, "OUT exists but is not the complete output"
    for leftover in partials(out):
        assert PARTIAL.fullmatch(leftover.name), leftover.name
        assert not (leftover / "repair_report.json").exists() or (leftover / MARKER).exists() or is_ours(leftover)


@pytest.mark.parametrize("point", ["temp_created", "mid_first_shard", "after_first_shard", "mid_rewrite", "before_publish"])
def test_sigkill_then_rerun_gives_the_uninterrupted_bytes(point, src, reference, tmp_path):
    out = tmp_path / "out"
    before = tree(src)
    done = killed_child(point, src, out)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not out.exists()
    left = partials(out)
    assert len(left) == 1 and (left[0] / MARKER).is_file(), left
    assert_nothing_looks_complete(out, reference)
    assert fix(src, out) == 0
    assert partials(out) == [], "the re-run did not remove the dead run's temp folder"
    assert_no_lock_left(out)
    assert tree(out) == reference
    assert tree(src) == before


def test_sigkill_before_the_marker_is_in_place_is_cleaned_up_by_the_next_run(src, reference, tmp_path):
    """Killed between creating the temp folder and renaming its marker in: the folder holds nothing
    (or only the staged marker), and the next run removes it (before, no run ever did)."""
    out = tmp_path / "out"
    done = killed_child("before_marker", src, out)
    assert done.returncode == -signal.SIGKILL, done.stderr
    left = partials(out)
    assert len(left) == 1 and {p.name for p in left[0].iterdir()} <= {f"{MARKER}.new"}, left
    assert fix(src, out) == 0
    assert partials(out) == [] and tree(out) == reference
    assert_no_lock_left(out)


@pytest.fixture(scope="module")
def other(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """An earlier output that differs from the reference: the old OUT an --overwrite replaces."""
    src = write_assistant(tmp_path_factory.mktemp("other") / "src", AssistantDims(hidden=256, backbone=512, intermediate=512, layers=1,
                                                                                 heads=2, head_dim=128, global_head_dim=256, vocab=4096))
    out = tmp_path_factory.mktemp("other_out") / "out"
    assert fix(src, out) == 0
    return out, tree(out)


@pytest.mark.parametrize("point,at_out", [("unmarked_before_swap", "old"), ("just_exchanged", "new"), ("marking_old_out", "new"),
                                          ("old_out_marked", "new"), ("deleting_old_out", "new")])
def test_sigkill_at_each_step_of_overwrite_leaves_one_whole_out_and_a_folder_the_next_run_removes(point, at_out, src, reference, other, tmp_path):
    """Issue 25, 10b: at every instant OUT is the old or the new output, whole (no marker in it), and the other is in a
    `.out.partial-<pid>-*` folder that is marked or provably ours by its report; the next run removes it."""
    from repair.io.ownership import is_ours

    old, old_tree = other
    out = tmp_path / "out"
    shutil.copytree(old, out)
    done = killed_child(point, src, out, "--overwrite")
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert tree(out) == (old_tree if at_out == "old" else reference), "OUT is not a whole output"
    [left] = partials(out)
    assert PARTIAL.fullmatch(left.name) and ((left / MARKER).is_file() or is_ours(left)), sorted(p.name for p in left.iterdir())
    assert fix(src, out, "--overwrite") == 0
    assert partials(out) == [] and tree(out) == reference
    assert_no_lock_left(out)


def test_sigkill_as_a_new_out_is_published_leaves_a_folder_its_report_proves_ours(src, reference, tmp_path):
    """OUT absent: killed after the temp folder gave up its marker, before the rename. No OUT; the next run
    proves the unmarked folder ours (every file its report lists, with that sha256) and removes it."""
    from repair.io.ownership import is_ours

    out = tmp_path / "out"
    done = killed_child("unmarked_before_swap", src, out)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert not out.exists()
    [left] = partials(out)
    assert not (left / MARKER).exists() and is_ours(left)
    assert fix(src, out) == 0
    assert partials(out) == [] and tree(out) == reference


def test_sigkill_from_outside_at_an_unplanned_moment(src, reference, tmp_path):
    """A plain external kill, as a scheduler or OOM killer does it, as soon as writing has begun."""
    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "repair", "fix", str(src), "-o", str(out), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until_writing(child, out)
    child.kill()
    child.wait()
    assert_nothing_looks_complete(out, reference)
    if not out.exists():
        assert fix(src, out) == 0
    assert partials(out) == [] and tree(out) == reference


def test_sigterm_removes_the_temp_folder_and_says_so(src, tmp_path):
    out = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "repair", "fix", str(src), "-o", str(out), "--quiet"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_until_writing(child, out)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=60)
    if child.returncode == 0:  # finished before the signal arrived: then it must be complete
        assert (out / "repair_report.json").is_file()
        return
    # click turns KeyboardInterrupt into Abort, which the CLI reports as "aborted"
    assert child.returncode == 130 and err.strip().splitlines() in (["aborted"], ["interrupted; nothing was written"]), err
    assert not out.exists() and partials(out) == []


def test_sigterm_as_the_temp_folder_is_created_still_removes_it(src, tmp_path):
    """The window CI once hit: the signal landed after the marked folder existed but before staged()
    knew its name, so nothing removed it."""
    out = tmp_path / "out"
    done = killed_child("term_temp_created", src, out)
    assert done.returncode == 130 and done.stderr.strip().splitlines() == ["interrupted; nothing was written"], done.stderr
    assert not out.exists() and partials(out) == []
    assert_no_lock_left(out)


def test_a_second_sigterm_as_the_cleanup_starts_still_removes_the_temp_folder(src, tmp_path):
    """A second signal (Ctrl-C pressed twice, a supervisor's repeated TERM) landing between the first
    KeyboardInterrupt reaching staged() and its cleanup holding signals skipped the cleanup."""
    out = tmp_path / "out"
    done = killed_child("term_twice_as_cleanup_starts", src, out)
    assert done.returncode == 130 and done.stderr.strip().splitlines()[-1] == "interrupted; nothing was written", done.stderr
    assert not out.exists() and partials(out) == []


def test_ctrl_c_after_out_is_published_does_not_say_nothing_was_written(src, reference, tmp_path):
    """Ctrl-C while the summary is printed: OUT is complete, and the line said "nothing was written"."""
    out = tmp_path / "out"
    done = killed_child("int_after_publish", src, out)
    assert done.returncode == 130 and done.stderr.strip().splitlines()[-1] == f"interrupted; {out} was already written and is complete", done.stderr
    assert tree(out) == reference and partials(out) == []


def test_sigterm_caught_by_another_thread_after_the_rename_lets_the_run_finish(src, reference, tmp_path):
    """Once OUT is renamed into place the run completes (exit 0, no marker left in OUT), even when the
    kernel hands the signal to a thread other than the one publishing (a signal mask cannot cover that)."""
    out = tmp_path / "out"
    done = killed_child("term_thread_after_rename", src, out)
    assert done.returncode == 0, done.stderr
    assert tree(out) == reference and not (out / MARKER).exists() and partials(out) == []


def make_partial(out: Path, pid: int, host: str | None = None, marker: bool = True) -> Path:
    folder = out.parent / f".{out.name}.partial-{pid}-abc123"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"half")
    if marker:
        (folder / MARKER).write_text(json.dumps({"pid": pid, "host": host or socket.gethostname()}))
    return folder


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_rerun_removes_only_temp_folders_whose_writer_is_gone(src, tmp_path):
    out = tmp_path / "out"
    stale = make_partial(out, dead_pid())
    alive = make_partial(out, os.getppid())  # a live process: maybe another run still writing
    foreign = make_partial(out, dead_pid(), host="another-host")  # NFS: that pid is not ours to judge
    unmarked = out.parent / f".{out.name}.partial-{dead_pid()}-zzz999"
    unmarked.mkdir()
    (unmarked / "keep.txt").write_text("not ours")
    assert fix(src, out) == 0
    assert not stale.exists()
    assert alive.exists() and foreign.exists() and unmarked.exists()


def test_the_marker_is_never_seen_half_written(tmp_path):
    """It appears by rename only, so a SIGKILL at any moment leaves it absent or whole.

    Before, it was written in place: a kill between creating and filling it (the moment the
    outside-kill test aims at) left an empty marker, and the folder was never cleaned up.
    """
    code = (
        "import sys; from pathlib import Path\n"
        "from repair.io import staging\n"
        "opened = []\n"
        "sys.addaudithook(lambda event, args: opened.append(args) if event == 'open' and str(args[0]).endswith(staging.MARKER) else None)\n"
        "tmp = staging.new_partial(Path(sys.argv[1]) / 'out')\n"
        "assert opened == [], opened\n"
        "assert staging.remove_stale_partials(Path(sys.argv[1]) / 'out') == []  # its writer is alive\n"
        "print(sorted(p.name for p in tmp.iterdir()))\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == repr([MARKER])


def test_an_interrupt_in_a_later_in_process_run_does_not_name_an_earlier_output(src, tmp_path, capsys, monkeypatch):
    """`main` remembers the OUT it published to say so when interrupted after it; a second run in the same process
    (tests, a Python caller) interrupted before writing anything must still say nothing was written."""
    import repair.api

    assert run_captured(capsys, "fix", src, "-o", tmp_path / "first", "--quiet")[0] == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(repair.api, "plan", interrupted)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "second", "--quiet")
    assert (code, err.strip()) == (130, "interrupted; nothing was written")
