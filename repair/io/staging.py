"""The output's temporary folder: created hidden beside OUT, published by one rename, and
cleaned up after a kill.

Every run writes into `.OUT.partial-<pid>-<random>` holding a marker with its pid and host.
SIGINT/SIGTERM remove it on the way out; SIGKILL and power loss cannot be caught, so each run
first removes such folders whose writer is gone. Publishing is a single rename (an atomic swap
when replacing an existing OUT), with files flushed first, so OUT is either absent, the old
one, or complete. The Hub commands' work folders use the same marker (`new_marked`, `remove_stale`).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from repair.errors import OutputError

PARTIAL_TAG = ".partial-"
MARKER = ".ckpt-repair-partial"  # first file in every temp folder: {"pid", "host"}; deleted from OUT once published
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def new_partial(out: Path) -> Path:
    """A hidden temp folder beside OUT, marked with our pid and host so a later run may clean it up."""
    return new_marked(out.parent, f".{out.name}{PARTIAL_TAG}")


def new_marked(parent: Path, prefix: str) -> Path:
    """A new folder `<prefix><pid>-<random>` in `parent`, marked as ours (see remove_stale)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        _mark(tmp)
    except BaseException:  # full disk, or Ctrl-C right here: the caller never learns the name
        discard(tmp)
        raise
    return tmp


def _mark(folder: Path) -> None:
    """Write the marker beside its final name and rename it into place: a marker that exists is
    whole. (Written in place, a SIGKILL between create and write left an empty marker, and no
    later run would ever remove that folder, since it cannot tell whose it is.)"""
    staged = folder / f"{MARKER}.new"
    staged.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    os.replace(staged, folder / MARKER)


def discard(tmp: Path | None) -> None:
    if tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)


def remove_stale_partials(out: Path) -> list[Path]:
    """Delete temp folders of earlier runs into OUT that were killed (SIGKILL, power loss)."""
    return remove_stale(out.parent, f".{out.name}{PARTIAL_TAG}")


def remove_stale(parent: Path, prefix: str) -> list[Path]:
    """Delete the folders `new_marked(parent, prefix)` made for runs that were killed.

    Only folders named `<prefix><pid>-*` holding our marker, written on this host by a process
    that no longer exists; anything else is left alone.
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)-\w+")
    removed = []
    for entry in sorted(parent.iterdir()):
        match = pattern.fullmatch(entry.name)
        if match and entry.is_dir() and not entry.is_symlink() and _owner_gone(entry, int(match[1])):
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def _owner_gone(folder: Path, pid: int) -> bool:
    try:
        owner = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(owner, dict) or owner.get("pid") != pid or owner.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


@contextmanager
def interrupts_raise():
    """While writing, SIGTERM acts like Ctrl-C (KeyboardInterrupt), so the temp folder is removed;
    once OUT is published both are ignored and the run finishes. SIGKILL cannot be caught: the
    next run removes what it leaves (remove_stale_partials)."""
    state = {"published": False}
    if threading.current_thread() is not threading.main_thread():
        yield state
        return

    def handler(signum, frame):
        if not state["published"]:
            raise KeyboardInterrupt

    old = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, previous in old.items():
        if previous is not signal.SIG_IGN:
            signal.signal(sig, handler)
    try:
        yield state
    finally:
        for sig, previous in old.items():
            if previous is not None:
                signal.signal(sig, previous)


def publish(tmp: Path, out: Path, state: dict) -> None:
    """Move the checked folder into place with SIGINT/SIGTERM held back, so it is all or nothing.

    Nothing after the rename may fail the run: OUT is complete from that moment on.
    """
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    try:
        old = _move_into_place(tmp, out)
        state["published"] = True
        _quietly(os.unlink, out / MARKER)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    if old is not None:
        _quietly(_mark, old)  # if we die while deleting the old OUT, the next run finishes the job
        shutil.rmtree(old, ignore_errors=True)
    _fsync(out.parent, best_effort=True)


def _quietly(fn, path: Path) -> None:
    try:
        fn(path)
    except OSError:
        pass


def _move_into_place(tmp: Path, out: Path) -> Path | None:
    """Rename the finished folder to OUT; an existing OUT (with --overwrite) is replaced only now,
    in one atomic swap where the OS has one, so OUT is never missing. Returns where the old OUT went."""
    if not out.exists():
        try:
            os.rename(tmp, out)
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            raise OutputError(f"{out}: appeared while this run was writing (another run?); choose another folder") from None
        return None
    if _exchange(tmp, out):
        return tmp
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}{PARTIAL_TAG}{os.getpid()}-", dir=out.parent))
    os.rename(out, old)  # onto the empty folder; a kill before the next line leaves the old OUT here, unmarked
    os.rename(tmp, out)
    return old


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths in one step (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def fsync_tree(folder: Path) -> None:
    """Flush every written file and folder, so a crash after the rename cannot leave empty files
    behind an OUT that looks complete."""
    for path in sorted(folder.rglob("*")):
        _fsync(path, best_effort=path.is_dir())
    _fsync(folder, best_effort=True)


def _fsync(path: Path, best_effort: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not best_effort:
            raise
