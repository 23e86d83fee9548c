"""The output's temporary folder: created hidden beside OUT, and cleaned up after a kill
(publishing it is repair/io/output.py).

Every run writes into `.OUT.partial-<pid>-<random>` holding a marker with its pid and host.
SIGINT/SIGTERM remove it on the way out; SIGKILL and power loss cannot be caught, so each run
first removes such folders whose writer is gone, and folders a kill left before their marker
was in place (empty, or holding only the staged marker). Before publishing, apply_modes gives
the output the modes a `cp -r` copy would have under the user's umask. The Hub commands' work
folders use the same marker (`new_marked`, `remove_stale`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import stat
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Callable


PARTIAL_TAG = ".partial-"
MAX_STEM_BYTES = 200  # room left for ".partial-<pid>-<random>" within the 255-byte file-name limit
MARKER = ".ckpt-repair-partial"  # first file in every temp folder: {"pid", "host"}; deleted from OUT once published
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def hidden_stem(out: Path) -> str:
    """`.OUT`, the start of every hidden name beside OUT. A name near the 255-byte limit is cut and
    given a hash of the whole, so the temp and lock names built on it still fit."""
    raw = os.fsencode(out.name)
    if len(raw) <= MAX_STEM_BYTES:
        return f".{out.name}"
    return f".{os.fsdecode(raw[:MAX_STEM_BYTES - 20])}~{hashlib.sha256(raw).hexdigest()[:12]}"


def new_partial(out: Path) -> Path:
    """A hidden temp folder beside OUT, marked with our pid and host so a later run may clean it up."""
    return new_marked(out.parent, f"{hidden_stem(out)}{PARTIAL_TAG}")


def new_marked(parent: Path, prefix: str) -> Path:
    """A new folder `<prefix><pid>-<random>` in `parent`, marked as ours (see remove_stale)."""
    tmp = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=parent))
    try:
        mark(tmp)
    except BaseException:  # full disk, or Ctrl-C right here: the caller never learns the name
        discard(tmp)
        raise
    return tmp


def apply_modes(tmp: Path, src: Path) -> None:
    """Give every written file and folder the mode `cp -r SRC OUT` would: its source's mode (a copied
    or rewritten file, a folder) or the default (a new file), under the umask. mkdtemp's 0700 would
    otherwise make OUT unreadable to a serving account."""
    umask = _umask()
    for path in [tmp, *sorted(tmp.rglob("*"))]:
        rel = path.relative_to(tmp)
        try:
            source = os.stat(src / rel).st_mode
            mode = source if stat.S_ISDIR(source) == path.is_dir() else None
        except OSError:
            mode = None
        if mode is None:
            mode = 0o777 if path.is_dir() else 0o666
        os.chmod(path, mode & 0o777 & ~umask)


def _umask() -> int:
    """The process umask, read without changing it where Linux says it (os.umask can only swap it)."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def mark(folder: Path) -> None:
    """Write the marker beside its final name and rename it into place: a marker that exists is
    whole. (Written in place, a SIGKILL between create and write left an empty marker, and no
    later run would ever remove that folder, since it cannot tell whose it is.)"""
    staged = folder / f"{MARKER}.new"
    staged.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}))
    os.replace(staged, folder / MARKER)


def discard(tmp: Path | None) -> None:
    """Remove a folder of ours with its marker last, so a kill half-way leaves it marked (or empty). Opened once,
    never through a link, and emptied through that handle: a folder swapped for a link (another user's, in /tmp)
    after the caller's checks loses nothing the link leads to."""
    if tmp is None:
        return
    try:
        fd = os.open(tmp, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for name in [n for n in os.listdir(fd) if n != MARKER]:
            try:
                if stat.S_ISDIR(os.lstat(name, dir_fd=fd).st_mode):
                    shutil.rmtree(name, dir_fd=fd, ignore_errors=True)  # rmtree never follows a link (avoids_symlink_attacks)
                else:
                    os.unlink(name, dir_fd=fd)
            except OSError:
                pass
        try:
            os.unlink(MARKER, dir_fd=fd)
        except OSError:
            pass
    finally:
        os.close(fd)
    try:
        tmp.rmdir()  # a link swapped in meanwhile: rmdir refuses it
    except OSError:
        pass


def remove_stale_partials(out: Path, inputs: tuple[Path, ...] = (), proven: Callable[[Path], bool] | None = None) -> list[Path]:
    """Delete temp folders of earlier runs into OUT that were killed (SIGKILL, power loss); `proven` says
    whether an unmarked one is provably a complete output of ours (a kill while publishing leaves one)."""
    return remove_stale(out.parent, f"{hidden_stem(out)}{PARTIAL_TAG}", inputs, proven)


def remove_stale(parent: Path, prefix: str, inputs: tuple[Path, ...] = (), proven: Callable[[Path], bool] | None = None) -> list[Path]:
    """Delete the folders `new_marked(parent, prefix)` made for runs that were killed.

    Only folders this user owns named `<prefix><pid>-*` whose pid no longer exists on this host, holding our marker
    written by that pid here (or, with `proven`, no marker and a proven output); never an input
    (SRC, --original), a folder holding one, or one inside one. Anything else is left alone.
    """
    pattern = re.compile(re.escape(prefix) + r"(\d+)-\w+")
    removed = []
    for entry in sorted(parent.iterdir()):
        match = pattern.fullmatch(entry.name)
        if not match or not _mine(entry) or _touches_input(entry, inputs):
            continue
        pid = int(match[1])
        if _owner_gone(entry, pid) or (_pid_gone(pid) and not (entry / MARKER).exists() and proven is not None and proven(entry)):
            discard(entry)
            removed.append(entry)
        elif _pid_gone(pid) and _remove_if_never_marked(entry):
            removed.append(entry)
    return removed


def _mine(entry: Path) -> bool:
    """A real folder (not a link) this user owns: in a folder others can write to, a marker alone proves nothing."""
    try:
        st = entry.lstat()
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid()


def _touches_input(folder: Path, inputs: tuple[Path, ...]) -> bool:
    """`folder` is an input, holds one, or is inside one (compared resolved, so links and `..` do not hide it)."""
    here = folder.resolve()
    for given in inputs:
        there = Path(given).resolve()
        if here == there or there.is_relative_to(here) or here.is_relative_to(there):
            return True
    return False


def _remove_if_never_marked(folder: Path) -> bool:
    """A kill between creating a temp folder and renaming its marker in leaves it empty or holding
    only the staged marker: remove exactly that (rmdir cannot delete anything else). Only for a
    pid (from the folder's name) that is gone: a live run may be between those two steps, and the
    Hub's work folders are not covered by OUT's lock."""
    try:
        if {p.name for p in folder.iterdir()} - {f"{MARKER}.new"}:
            return False
        (folder / f"{MARKER}.new").unlink(missing_ok=True)
        folder.rmdir()
    except OSError:
        return False
    return True


def _owner_gone(folder: Path, pid: int) -> bool:
    try:
        owner = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError, RecursionError):  # not a marker we wrote: not provably ours
        return False
    if not isinstance(owner, dict) or owner.get("pid") != pid or owner.get("host") != socket.gethostname():
        return False
    return _pid_gone(pid)


def _pid_gone(pid: int) -> bool:
    """No process with this pid exists on this host (one owned by someone else still counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, owned by someone else
        return False
    return False


class InterruptGate:
    """What SIGINT/SIGTERM do to a run that is writing OUT: raise KeyboardInterrupt (so the temp folder
    is removed), wait until the end of a `held()` step that must not be cut in two, or nothing once
    OUT is published. Decided in the Python handler, which always runs in the main thread: a signal
    mask would not do, since the kernel may deliver the signal to another thread (tqdm's, a hasher)."""

    def __init__(self) -> None:
        self.published = False
        self._holding = 0
        self._pending = False
        self._raised = False

    def on_signal(self, signum, frame) -> None:
        if self.published:
            return
        if self._holding or self._raised:  # raised: a second signal must not cut the cleanup short before it is held
            self._pending = True
            return
        self._raised = True
        raise KeyboardInterrupt

    @contextmanager
    def held(self):
        """Signals wait until the step is done, then interrupt (unless OUT was published meanwhile)."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if not self._holding and self._pending and not self.published:
            self._pending, self._raised = False, True
            raise KeyboardInterrupt


@contextmanager
def interrupts_raise():
    """While writing, SIGTERM acts like Ctrl-C (KeyboardInterrupt), so the temp folder is removed;
    once OUT is published both are ignored and the run finishes. Yields the run's InterruptGate.
    SIGKILL cannot be caught: the next run removes what it leaves (remove_stale_partials)."""
    gate = InterruptGate()
    if threading.current_thread() is not threading.main_thread():
        yield gate
        return
    old = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig, previous in old.items():
        if previous is not signal.SIG_IGN:
            signal.signal(sig, gate.on_signal)
    try:
        yield gate
    finally:
        for sig, previous in old.items():
            if previous is not signal.SIG_IGN:  # ours was installed; None: a handler not set from Python, give back the default
                signal.signal(sig, previous if previous is not None else signal.SIG_DFL)


def fsync_tree(folder: Path) -> None:
    """Flush every written file and folder, so a crash after the rename cannot leave empty files
    behind an OUT that looks complete."""
    for path in sorted(folder.rglob("*")):
        fsync_path(path, best_effort=path.is_dir())
    fsync_path(folder, best_effort=True)


def fsync_path(path: Path, best_effort: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        if not best_effort:
            raise
