"""The marker-and-pid rule removes a dead run's work folder (the web server's doctor-tmp, the Hub commands' temp
folders, fix's partial folders). In a folder other users can write to (/tmp), a marker proves nothing by itself:
another user can write one naming a dead pid, then swap the folder for a link to ours the moment we read it. Only a
folder this user owns is ever removed, and never through a link swapped in after the checks."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from repair.io import staging
from repair.io.staging import MARKER

PREFIX = "ckpt-repair-hub-"


def dead_pid() -> int:
    pid = 4_000_000
    while not staging._pid_gone(pid):
        pid -= 1
    return pid


def forged(parent: Path, pid: int) -> Path:
    folder = parent / f"{PREFIX}{pid}-forged"
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    (folder / "weights.bin").write_bytes(b"x")
    return folder


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder owned by another user needs root")
def test_a_marked_folder_another_user_owns_is_left_alone(tmp_path):
    folder = forged(tmp_path, dead_pid())
    for path in (folder, folder / MARKER, folder / "weights.bin"):
        os.chown(path, 54321, 54321)
    assert staging.remove_stale(tmp_path, PREFIX) == []
    assert (folder / "weights.bin").exists()


def test_a_folder_swapped_for_a_link_after_its_marker_is_read_loses_nothing_it_leads_to(tmp_path, monkeypatch):
    """The race an inotify watch on the marker wins: the marker is read, then the folder becomes a link to ours."""
    shared, mine = tmp_path / "shared", tmp_path / "mine"
    shared.mkdir(), mine.mkdir()
    (mine / "model.safetensors").write_bytes(b"precious")
    (mine / "sub").mkdir()
    (mine / "sub" / "file").write_bytes(b"precious")
    pid = dead_pid()
    folder = forged(shared, pid)
    owner_gone = staging._owner_gone

    def read_then_swap(entry, p):
        answer = owner_gone(entry, p)
        entry.rename(shared / "away")
        entry.symlink_to(mine, target_is_directory=True)
        return answer

    monkeypatch.setattr(staging, "_owner_gone", read_then_swap)
    staging.remove_stale(shared, PREFIX)
    assert (mine / "model.safetensors").read_bytes() == b"precious" and (mine / "sub" / "file").exists()
    assert folder.is_symlink()  # left as found: not ours to remove


def test_a_dead_runs_own_folder_is_still_removed(tmp_path):
    folder = forged(tmp_path, dead_pid())
    (folder / "sub").mkdir()
    (folder / "sub" / "f").write_bytes(b"x")
    assert staging.remove_stale(tmp_path, PREFIX) == [folder]
    assert not folder.exists()
