"""File names that come from data (an index, tp_manifest.json, a Hub listing, a recipe or report):
hostile until checked, and checked here only.

A name is used only when it is a plain relative path that stays inside its folder: text, no
control characters or backslashes, not absolute, no empty, `.` or `..` part. Joined to its folder,
it must resolve inside that folder (a symlink may not lead out), and a file we read must be a
regular file: opening a FIFO blocks forever, a device reads without end, a socket cannot be opened.
The type is checked with stat, before anything is opened.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath

from repair.errors import BadInput

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_NAME_CHARS = 1000


def name_problem(name: object) -> str | None:
    """Why `name` is not a plain relative path inside its folder, or None when it is."""
    if not isinstance(name, str) or not name:
        return "is empty or not text"
    if len(name) > MAX_NAME_CHARS:
        return f"is over {MAX_NAME_CHARS} characters"
    if _CONTROL.search(name):
        return "contains control characters"
    if "\\" in name:
        return "contains a backslash"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "is an absolute path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "has an empty, '.' or '..' component"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text"
    return None


def plain_name(name: object) -> bool:
    """A relative path that stays inside its folder (not absolute; no '..', '.' or empty part; no NUL):
    the looser rule for names we planned ourselves (repair/planning/check.py): any name a local folder
    listing yields passes, so only a bug fails it. Names read from data take name_problem."""
    if not isinstance(name, str) or not name or "\0" in name or name.startswith("/"):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def check_name(name: object, where: object, fix: str) -> str:
    """`name` itself when it is a plain relative path; else BadInput naming `where` and what to do."""
    why = name_problem(name)
    if why:
        raise BadInput(f"{where}: file name {name!r} {why}; names must stay inside their folder, {fix}")
    return str(name)


def inside(root: Path, name: object, where: object, fix: str) -> Path:
    """`root / name` for a checked name, proven to resolve inside `root` (links included)."""
    check_name(name, where, fix)
    base = Path(root).resolve()
    path = base.joinpath(*PurePosixPath(str(name)).parts)
    if not path.resolve().is_relative_to(base):
        raise BadInput(f"{where}: file name {name!r} leads outside {root} (through a symlink); {fix}")
    return path


def path_text(path: object) -> str:
    """A local path as text a report or manifest can hold: a byte that is not UTF-8 (any Linux path
    may have one) is written as `\\xff` instead of failing the write. For the record only, never reopened."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def file_type_problem(path: Path) -> str | None:
    """Why `path` (links followed) is not a regular file we may open, or None; never opens it."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is missing"
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"
    if stat.S_ISREG(mode):
        return None
    kind = {stat.S_ISDIR: "a folder", stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISSOCK: "a socket",
            stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device"}
    return "is " + next((what for test, what in kind.items() if test(mode)), "not a regular file") + ", not a regular file"


def regular_file(path: Path, fix: str = "replace it with the real file") -> Path:
    """`path` when it is a regular file (stat, links followed); else BadInput saying what it is."""
    why = file_type_problem(path)
    if why:
        raise BadInput(f"{path}: {why}; {fix}")
    return path
