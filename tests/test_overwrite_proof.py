"""--overwrite replaces only what is provably ours, and no cleanup removes an input (issue 25, point 4).

A folder is replaced only when every file in it is listed in its repair_report.json with the same
sha256 and nothing else is there; otherwise one line (exit 2) names the first foreign or changed file
and the folder is left as it was. A folder named like a dead run's temp folder is never removed
when it is an input (SRC or --original), or holds one.
"""

from __future__ import annotations

import json
import shutil
import socket
from pathlib import Path

import pytest

from repair.io.staging import MARKER
from tests.conftest import run_captured, run_cli
from tests.test_output_ownership import earlier, src  # noqa: F401 (fixtures)
from tests.test_reliability_corpus import tree


def refused(capsys, src, out, *extra) -> str:
    before = tree(out)
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet", "--overwrite", *extra)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert tree(out) == before, "the folder was changed"
    assert not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.")], "a temp folder or lock was left"
    return err


def test_a_junk_report_does_not_make_a_folder_ours(capsys, src, tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    (out / "repair_report.json").write_text("junk\n")
    (out / "data.csv").write_text("d\n")
    err = refused(capsys, src, out)
    assert "repair_report.json" in err and "--overwrite" in err


def test_a_report_that_does_not_list_a_file_does_not_make_it_ours(capsys, src, tmp_path):
    out = tmp_path / "x"
    out.mkdir()
    (out / "repair_report.json").write_text(json.dumps({"tool": {"name": "ckpt-repair"}, "outputs": []}))
    (out / "data.csv").write_text("d\n")
    err = refused(capsys, src, out)
    assert "data.csv" in err


@pytest.mark.parametrize("where", ["top", "nested"])
def test_a_file_added_to_an_earlier_output_is_never_deleted(capsys, src, earlier, tmp_path, where):
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    added = out / "notes.txt" if where == "top" else out / "mine" / "notes.txt"
    added.parent.mkdir(exist_ok=True)
    added.write_text("my notes\n")
    err = refused(capsys, src, out)
    assert added.relative_to(out).as_posix() in err and "not listed" in err, err


def test_a_changed_file_of_an_earlier_output_is_never_replaced(capsys, src, earlier, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    shard = next(out.glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1  # same size, different bytes
    shard.write_bytes(bytes(data))
    err = refused(capsys, src, out)
    assert shard.name in err and "changed" in err, err


def test_a_symlink_in_an_earlier_output_is_foreign(capsys, src, earlier, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    (out / "link").symlink_to(tmp_path)
    assert "link" in refused(capsys, src, out)


def test_an_unchanged_earlier_output_is_replaced(capsys, src, earlier, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    assert run_cli("fix", src, "-o", out, "--quiet", "--overwrite") == 0
    assert tree(out) == tree(earlier)
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_tp_and_unshard_outputs_are_provably_ours(src, tmp_path):
    ranks, std = tmp_path / "ranks", tmp_path / "std"
    assert run_cli("fix", src, "-o", ranks, "--tp", "2", "--quiet") == 0
    first = tree(ranks)
    assert run_cli("fix", src, "-o", ranks, "--tp", "2", "--quiet", "--overwrite") == 0
    assert tree(ranks) == first
    assert run_cli("unshard", ranks, "-o", std) == 0
    assert run_cli("unshard", ranks, "-o", std, "--overwrite") == 0
    (ranks / "rank-1" / "extra.bin").write_bytes(b"mine")
    assert run_cli("fix", src, "-o", ranks, "--tp", "2", "--quiet", "--overwrite") == 2
    assert (ranks / "rank-1" / "extra.bin").read_bytes() == b"mine"


def dead_marker(folder: Path) -> None:
    (folder / MARKER).write_text(json.dumps({"pid": 999999, "host": socket.gethostname()}))


def test_an_input_named_like_a_dead_runs_temp_folder_is_never_removed(capsys, src, tmp_path):
    """`fix .out.partial-999999-abcd -o out`: SRC was deleted when it held a marker with a dead pid."""
    disguised = tmp_path / ".out.partial-999999-abcd"
    shutil.copytree(src, disguised)
    dead_marker(disguised)
    before = tree(disguised)
    code, _, err = run_captured(capsys, "fix", disguised, "-o", tmp_path / "out", "--quiet")
    assert disguised.is_dir() and tree(disguised) == before, "the input was removed"
    assert code == 0, err


def test_an_original_named_like_a_dead_runs_temp_folder_is_never_removed(capsys, broken_export, original_model, tmp_path):
    disguised = tmp_path / ".out.partial-999999-orig"
    shutil.copytree(original_model, disguised)
    dead_marker(disguised)
    before = tree(disguised)
    run_captured(capsys, "fix", broken_export, "-o", tmp_path / "out", "--original", disguised, "--quiet")
    assert disguised.is_dir() and tree(disguised) == before, "--original was removed"


def test_a_folder_holding_an_input_is_never_removed(capsys, src, tmp_path):
    holder = tmp_path / ".out.partial-999999-hold"
    holder.mkdir()
    dead_marker(holder)
    shutil.copytree(src, holder / "src")
    before = tree(holder)
    run_captured(capsys, "fix", holder / "src", "-o", tmp_path / "out", "--quiet")
    assert tree(holder) == before, "the folder holding the input was removed"


def test_a_dead_runs_real_temp_folder_is_still_removed(src, tmp_path):
    stale = tmp_path / ".out.partial-999999-dead"
    stale.mkdir()
    dead_marker(stale)
    (stale / "half.safetensors").write_bytes(b"\0" * 10)
    assert run_cli("fix", src, "-o", tmp_path / "out", "--quiet") == 0
    assert not stale.exists()


def test_a_report_listing_a_very_deep_name_is_refused_in_bounded_time(capsys, src, tmp_path):
    """The proof's subfolder rule took every prefix of every listed name: a 40 KB name of 20,000 `a/` cost 11 s
    and 400 MB (quadratic); a report near its 256 MB limit would never finish. Listed names no file has are ignored."""
    import time

    out = tmp_path / "x"
    out.mkdir()
    deep = "a/" * 200_000 + "x"
    (out / "repair_report.json").write_text(json.dumps({"tool": {"name": "ckpt-repair"}, "outputs": [{"name": deep, "sha256": "0" * 64}]}))
    (out / "data.csv").write_text("d\n")
    start = time.monotonic()
    assert "data.csv" in refused(capsys, src, out)
    assert time.monotonic() - start < 10


@pytest.mark.parametrize("name", [MARKER, f"{MARKER}.new"])
def test_a_run_marker_left_in_an_earlier_output_is_ours_but_a_file_of_that_name_is_not(capsys, src, earlier, tmp_path, name):
    """A kill inside mark() leaves the swapped-out OUT with a staged marker and nothing proved it ours, so no run
    ever removed it (a whole output's worth of disk); older versions killed just after publishing left a marker in
    OUT. A marker holds {pid, host} only: a file of that name holding anything else is the user's."""
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    (out / name).write_text("my notes\n")
    assert name in refused(capsys, src, out)
    dead_marker(out) if name == MARKER else (out / name).write_text(json.dumps({"pid": 999999, "host": "h"}))
    assert run_cli("fix", src, "-o", out, "--quiet", "--overwrite") == 0
    assert tree(out) == tree(earlier)


@pytest.mark.parametrize("swap", ["fifo", "link to /dev/zero"])
def test_a_listed_file_swapped_for_a_fifo_or_a_device_link_while_proving_is_refused_without_hanging(earlier, tmp_path, monkeypatch, swap):
    """Between the walk and the hashing, a listed shard becomes a FIFO (open blocked for ever) or a link to
    /dev/zero (read for ever): the proof opens each file once, without following a link or waiting on a FIFO,
    and hashes it only if it is still the file the walk saw."""
    import os
    import threading

    import repair.io.ownership as ownership
    from repair.errors import OutputError

    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    shard = next(out.glob("*.safetensors"))
    real_walk = ownership._walk

    def walk_then_swap(folder):
        entries = real_walk(folder)
        shard.unlink()
        os.mkfifo(shard) if swap == "fifo" else shard.symlink_to("/dev/zero")
        return entries

    monkeypatch.setattr(ownership, "_walk", walk_then_swap)
    result = {}

    def prove():
        try:
            ownership.prove_ours(out)
        except OutputError as err:
            result["err"] = str(err)

    worker = threading.Thread(target=prove, daemon=True)
    worker.start()
    worker.join(20)
    if worker.is_alive() and swap == "fifo":
        with open(shard, "wb"):  # let the blocked open return, so the thread ends
            pass
    assert not worker.is_alive(), "the proof hangs"
    assert shard.name in result["err"] and "changed" in result["err"], result
