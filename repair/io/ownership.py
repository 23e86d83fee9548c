"""Whether a folder is provably an earlier ckpt-repair output, the only thing `--overwrite` replaces.

Provably ours: a real folder whose every file is listed in its repair_report.json (`outputs`, by
relative name, with sha256), whose every subfolder leads to a listed file, and which holds nothing
else (no symlink, no FIFO, no file the report does not name, but a run marker of ours that a kill
left); an empty folder holds nothing to lose. The report is the anchor: it cannot list itself. Proving it costs one read of the old folder
(every listed file is hashed once, when the run starts); at the swap the folder is matched against
that proof by stat alone (inode, size, mtime and ctime of every entry), so nothing is read twice.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from repair.errors import OutputError
from repair.io.hashing import hash_fd
from repair.io.staging import MARKER

REPORT_NAME = "repair_report.json"  # what every ckpt-repair output holds (repair.execute.report writes it)
REPORT_LIMIT = 256 << 20
_HEX = frozenset("0123456789abcdef")
MARKERS = (MARKER, f"{MARKER}.new")  # our run marker, whole or staged: a kill can leave either in a folder of ours
MARKER_LIMIT = 4096

Entry = tuple[str, int, int, int, int, int, int]  # (relative name, mode, dev, ino, size, mtime_ns, ctime_ns)


@dataclass(frozen=True)
class Proof:
    """What was proven of a folder: every entry's identity when it was hashed."""

    entries: tuple[Entry, ...]


def prove_ours(folder: Path, *, hash_files: bool = True) -> Proof:
    """The proof that `folder` is an earlier ckpt-repair output, or OutputError naming the first foreign or
    changed file. `hash_files=False` checks the names only (a cheap early refusal before planning)."""
    if folder.is_symlink() or not folder.is_dir():
        raise OutputError(f"{folder}: --overwrite only replaces a folder; this is not one")
    entries = _walk(folder)
    if not entries:
        return Proof(())
    listed = _listed(folder, entries)
    parents = _parents(n for n, mode, *_ in entries if stat.S_ISREG(mode) and n in listed)
    for name, mode, *_ in sorted(entries, key=lambda e: stat.S_ISDIR(e[1])):  # a foreign file before the folder holding it
        ok = (stat.S_ISREG(mode) and (name in listed or name == REPORT_NAME or _is_marker(folder, name, mode))) or \
            (stat.S_ISDIR(mode) and name in parents)
        if not ok:
            raise _foreign(folder, name, "is not listed in its repair_report.json")
    if hash_files:
        for entry in entries:
            name = entry[0]
            if name in listed and (_sha256_of(folder, entry) != listed[name] or _entry(folder, name) != entry):
                raise _foreign(folder, name, "changed since ckpt-repair wrote it (its sha256 differs from repair_report.json)")
    return Proof(tuple(entries))


def is_ours(folder: Path) -> bool:
    try:
        prove_ours(folder)
    except (OutputError, OSError):
        return False
    return True


def still_proven(folder: Path, proof: Proof) -> bool:
    """`folder` holds exactly the entries that were proven, untouched since (stat only: no byte is read again)."""
    try:
        return not folder.is_symlink() and folder.is_dir() and tuple(_walk(folder)) == proof.entries
    except OSError:
        return False


def _parents(names) -> set[str]:
    """Every folder above the given files (names found on disk, never the report's: a listed name of 10^5
    levels would cost quadratic time); each folder is added once, so the cost is linear in the walk."""
    parents: set[str] = set()
    for name in names:
        while "/" in name:
            name = name.rsplit("/", 1)[0]
            if name in parents:
                break
            parents.add(name)
    return parents


def _is_marker(folder: Path, name: str, mode: int) -> bool:
    """A run marker of ours left in the folder, nothing else: a kill between writing the swapped-out OUT's staged
    marker and renaming it in left one (and older versions, killed just after publishing, a whole one in OUT);
    such a folder was never removed. Holds `{"pid", "host"}` only, or nothing (killed before its one write)."""
    if name not in MARKERS or not stat.S_ISREG(mode):
        return False
    try:
        with open(folder / name, "rb", opener=lambda path, flags: os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK)) as fh:
            text = fh.read(MARKER_LIMIT + 1)
        owner = json.loads(text) if text else {"pid": 0, "host": ""}
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(owner, dict) and owner.keys() == {"pid", "host"} and type(owner["pid"]) is int and isinstance(owner["host"], str)


def _sha256_of(folder: Path, entry: Entry) -> str | None:
    """sha256 of the file the walk saw, read through one handle opened without following a link or waiting on a
    FIFO; None when the path is no longer that file (swapped for a FIFO, open() waited for ever)."""
    try:
        fd = os.open(folder / entry[0], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOENT, errno.ENXIO):
            return None
        raise
    try:
        st = os.fstat(fd)
        if _identity(entry[0], st) != entry:
            return None
        digest = hashlib.sha256()
        hash_fd(fd, digest, 0, st.st_size)
        return digest.hexdigest()
    except EOFError:  # it got shorter while it was hashed
        return None
    finally:
        os.close(fd)


def _foreign(folder: Path, name: str, why: str) -> OutputError:
    return OutputError(f"{folder}: --overwrite only replaces an earlier ckpt-repair output, and {name} {why}; "
                       "it was left alone: move that file away, or choose another folder")


def _listed(folder: Path, entries: list[Entry]) -> dict[str, str]:
    """{relative name: sha256} of the report's outputs; OutputError when there is no readable report."""
    report = next((e for e in entries if e[0] == REPORT_NAME and stat.S_ISREG(e[1])), None)
    try:
        if report is None or report[4] > REPORT_LIMIT:
            raise ValueError
        data = json.loads((folder / REPORT_NAME).read_bytes())
        outputs = data["outputs"] if isinstance(data, dict) and isinstance(data.get("tool"), dict) and \
            data["tool"].get("name") == "ckpt-repair" else None
        listed = {o["name"]: o["sha256"] for o in outputs}
        if not all(isinstance(n, str) and isinstance(h, str) and len(h) == 64 and set(h) <= _HEX for n, h in listed.items()):
            raise ValueError
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        first = REPORT_NAME if report is not None else next(e[0] for e in entries)
        why = "is not a ckpt-repair report" if report is not None else f"is there, and there is no {REPORT_NAME}"
        raise _foreign(folder, first, why) from None
    return listed


def _walk(folder: Path) -> list[Entry]:
    """Every entry below `folder` (never following a link), sorted by name, with its identity."""
    found: list[Entry] = []
    pending = [""]
    while pending:
        rel = pending.pop()
        with os.scandir(folder / rel if rel else folder) as it:
            for item in it:
                name = f"{rel}/{item.name}" if rel else item.name
                found.append(_entry(folder, name))
                if item.is_dir(follow_symlinks=False):
                    pending.append(name)
    return sorted(found)


def _entry(folder: Path, name: str) -> Entry:
    return _identity(name, os.stat(folder / name, follow_symlinks=False))


def _identity(name: str, st: os.stat_result) -> Entry:
    return (name, st.st_mode, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
