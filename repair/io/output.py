"""Owning OUT for one run: a lock against other runs, the temp folder's lifetime, and the swap.

Publishing never removes what we did not write. The decision is taken at the moment of the
rename, not only when the run starts (OUT may appear meanwhile): an absent OUT is taken by a
rename that cannot replace anything (renameat2 RENAME_NOREPLACE); an existing OUT is replaced
only with --overwrite, by an atomic exchange, and only when it is provably an earlier ckpt-repair
output (repair/io/ownership.py: proven once, by hash, when the run starts; matched by stat at the
swap, before and after it); anything else is swapped straight back and the run fails with one line.
A SIGKILL at any step leaves the old or the new OUT at OUT, and the other in `.OUT.partial-<pid>-*`,
provably ours by its report or its marker, which the next run removes (without an atomic exchange,
a kill between its two renames leaves no OUT, and both outputs there). Runs of this tool into one
OUT exclude each other with flock on a hidden `.OUT.lock` beside it, removed when the run ends; a
killed run's lock file holds no lock (the kernel drops it) and the next run takes it over.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from repair.errors import OutputError
from repair.io.ownership import REPORT_NAME, Proof, is_ours, prove_ours, still_proven
from repair.io.staging import MARKER, PARTIAL_TAG, InterruptGate, fsync_path, mark, discard, hidden_stem, interrupts_raise, new_partial, remove_stale_partials

LOCK_TAG = ".lock"
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2
PUBLISHED: list[Path | str] = []  # every OUT (or Hub commit) this run published: the CLI must not then say "nothing was written"


@contextmanager
def staged(out: Path, inputs: tuple[Path, ...] = ()) -> Iterator[tuple[Path, InterruptGate]]:
    """Lock OUT, clean up after dead runs (never an input, nor a folder holding one), and yield (temp
    folder, the run's InterruptGate); the temp folder is removed if the body raises (Ctrl-C and SIGTERM
    included). A signal while the folder is being created waits until its name is known, so it cannot
    escape before the cleanup is armed."""
    with interrupts_raise() as gate, output_lock(out):
        remove_stale_partials(out, inputs, is_ours)
        tmp = None
        try:
            with gate.held():
                tmp = new_partial(out)
            yield tmp, gate
        except BaseException:
            with gate.held():
                discard(tmp)  # still under the lock: the next run never sees it half removed
            raise


@contextmanager
def output_lock(out: Path) -> Iterator[None]:
    """Hold OUT's lock for the run, or fail at once with one line if another run holds it."""
    path = out.parent / f"{hidden_stem(out)}{LOCK_TAG}"
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise OutputError(f"{out}: another ckpt-repair run is writing this folder right now; wait for it to finish or choose another -o") from None
        if _same_file(fd, path):
            break
        os.close(fd)  # the holder removed this file as it finished: lock the one there now
    try:
        yield
    finally:
        try:
            os.unlink(path)  # while still locked, so nobody holds a lock on a file about to vanish unnoticed
        except OSError:
            pass
        os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def publish(tmp: Path, out: Path, gate: InterruptGate, overwrite: bool, proof: Proof | None = None) -> None:
    """Move the checked folder into place with SIGINT/SIGTERM held back, so it is all or nothing.

    `proof`: what was proven of OUT when the run started (None: OUT was absent). Nothing after the
    rename may fail the run: OUT is complete from that moment on. The marker leaves the temp folder
    first: from then on its report proves it ours, so a SIGKILL at any later step leaves the old or
    the new OUT at OUT and the other in a `.OUT.partial-<pid>-*` folder the next run proves and removes.
    """
    with gate.held():
        os.unlink(tmp / MARKER)
        old = _move_into_place(tmp, out, overwrite, proof)
        gate.published = True
        PUBLISHED.append(out)
    if old is not None:
        _quietly(mark, old)  # a kill while deleting it leaves a marked folder the next run removes
        discard(old)
    fsync_path(out.parent, best_effort=True)


def _quietly(fn, path: Path) -> None:
    try:
        fn(path)
    except OSError:
        pass


def _move_into_place(tmp: Path, out: Path, overwrite: bool, proof: Proof | None) -> Path | None:
    """Rename the finished folder to OUT; returns where a replaced OUT went (None: OUT was absent)."""
    if _rename_noreplace(tmp, out):
        return None
    if not overwrite:
        raise OutputError(f"{out}: appeared while this run was writing (another program or run?); it was left alone, choose another folder")
    if proof is None:  # OUT appeared while this run was writing: prove it now
        try:
            proof = prove_ours(out)
        except OutputError:
            raise OutputError(f"{out}: appeared while this run was writing and is not a ckpt-repair output this run may replace; "
                              "it was left alone, choose another folder") from None
    replaced = OutputError(f"{out}: was changed or replaced while this run was writing, and is not a ckpt-repair output this "
                           "run proved at its start; it was left alone, re-run")
    if not still_proven(out, proof):
        raise replaced
    if _rename2(tmp, out, _RENAME_EXCHANGE):
        if not still_proven(tmp, proof):  # OUT changed between the check and the swap: put it back
            _rename2(tmp, out, _RENAME_EXCHANGE)
            raise replaced
        return tmp
    old = Path(tempfile.mkdtemp(prefix=f"{hidden_stem(out)}{PARTIAL_TAG}{os.getpid()}-", dir=out.parent))
    os.rename(out, old)  # no atomic exchange here: onto the empty folder; a kill before the next line leaves no OUT
    if not still_proven(old, proof):  # OUT changed between the check and the rename: put it back
        os.rename(old, out)
        raise replaced
    os.rename(tmp, out)
    return old


def _rename_noreplace(tmp: Path, out: Path) -> bool:
    """Rename tmp to OUT only if nothing is at OUT (atomically where the OS can); False if something is."""
    if _rename2(tmp, out, _RENAME_NOREPLACE):
        return True
    if os.path.lexists(out):
        return False
    try:
        os.rename(tmp, out)  # no renameat2: a folder appearing in this instant is refused unless it is empty
    except OSError as exc:
        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR):
            return False
        raise
    return True


def _rename2(a: Path, b: Path, flags: int) -> bool:
    """Linux renameat2; False when the OS lacks it, or when RENAME_NOREPLACE finds b there."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP) or (err == errno.EEXIST and flags == _RENAME_NOREPLACE):
        return False
    raise OSError(err, os.strerror(err), str(b))
