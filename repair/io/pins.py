"""Inputs pinned at plan time: each file opened once, its identity recorded, every byte read through that handle.

A checkpoint is read over seconds to minutes, and nothing stops another process from replacing or
rewriting a file meanwhile. Reading through the handle opened at plan time means an atomic replace
cannot mix two files' bytes into one output; checking each file's identity (device, inode, size,
mtime, ctime) again before publishing catches an in-place rewrite, a truncation or a replace, and the
run then publishes nothing (exit 2). A `Pins` table is a value held by the Checkpoint (or by `unshard`'s
run), never a module-level cache; its files are closed when it is collected.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
import weakref
from dataclasses import dataclass
from pathlib import Path

from repair.errors import BadInput


@dataclass(frozen=True)
class Identity:
    """What must not change while a file is read. ctime too: no program can set it back (mtime can be)."""

    dev: int
    ino: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, st: os.stat_result) -> "Identity":
        return cls(st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class PinnedFile:
    """One input file opened once: reads go through its descriptor, never through the path again."""

    def __init__(self, path: Path):
        self.path = Path(path)
        # O_NONBLOCK: a FIFO swapped in after the type check must not block the open; a regular file ignores it
        fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        self._closer = weakref.finalize(self, os.close, fd)
        self.fd = fd
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            self._closer()
            raise BadInput(f"{self.path}: is not a regular file; replace it with the real file")
        self.identity = Identity.of(st)
        self.content: bytes | None = None  # its whole bytes, when they were read whole (read_all): the report hashes these

    @property
    def size(self) -> int:
        return self.identity.size

    def read_into(self, offset: int, view: memoryview) -> int:
        """Fill `view` from `offset` (returns its length); a file that ends first raises EOFError (it was truncated)."""
        done = 0
        while done < view.nbytes:
            got = os.preadv(self.fd, [view[done:]], offset + done)
            if got == 0:
                raise EOFError(f"{self.path}: ended {view.nbytes - done} bytes early")
            done += got
        return done

    def read(self, offset: int, length: int) -> bytearray:
        buffer = bytearray(length)
        self.read_into(offset, memoryview(buffer))
        return buffer

    def read_all(self) -> bytes:
        """The whole file as pinned (a small file: config, index), kept: the report records the sha256 of
        the bytes the output was built from (hashed by the writer: header-only commands never load OpenSSL)."""
        self.content = bytes(self.read(0, self.size))
        return self.content

    def changed(self) -> str | None:
        """Why this file is no longer the one pinned, or None: its path names another file, or the open
        file's identity (or the path's) differs from the one recorded."""
        try:
            now = Identity.of(os.stat(self.path))
        except OSError:
            return "was removed or replaced while it was being read"
        if (now.dev, now.ino) != (self.identity.dev, self.identity.ino):
            return "was replaced while it was being read"
        if now != self.identity or Identity.of(os.fstat(self.fd)) != self.identity:
            return "changed while it was being read"
        return None

    def close(self) -> None:
        self._closer()


def open_files_allowed(count: int) -> int:
    """How many files this process may open at once, the soft limit raised to the hard one first when below
    `count` (a process may raise its own; `ulimit -n` is often 1024 of a far higher hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count and _more_descriptors():
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return count if soft == resource.RLIM_INFINITY else soft


def _more_descriptors() -> bool:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft >= hard:
        return False
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return True


class Pins:
    """The table of one input's pinned files, by path; `check()` before publishing."""

    def __init__(self) -> None:
        self._files: dict[Path, PinnedFile] = {}

    def pin(self, path: Path) -> PinnedFile:
        path = Path(path)
        found = self._files.get(path)
        if found is None:
            try:
                found = PinnedFile(path)
            except OSError as exc:  # a folder of thousands of files past a 1024-descriptor soft limit: raise it to the hard one
                if exc.errno != errno.EMFILE or not _more_descriptors():
                    raise
                found = PinnedFile(path)
            self._files[path] = found
        return found

    def get(self, path: Path) -> PinnedFile | None:
        return self._files.get(Path(path))

    def __len__(self) -> int:
        return len(self._files)

    def check(self, role: str = "SRC") -> None:
        """Every pinned file still the one read, or BadInput naming the first that is not: nothing may be published."""
        for path, pinned in self._files.items():
            _refuse(role, pinned.changed(), path)

    def release(self, path: Path, role: str = "SRC") -> None:
        """Forget one file once its bytes are all read (a download about to be deleted): checked first, so a
        change while it was read is still caught; then closed."""
        pinned = self._files.pop(Path(path), None)
        if pinned is not None:
            why = pinned.changed()
            pinned.close()
            _refuse(role, why, path)

    def close(self) -> None:
        for pinned in self._files.values():
            pinned.close()


def _refuse(role: str, why: str | None, path: Path) -> None:
    if why is not None:
        raise changed_input(path, why, role)


def changed_input(path: Path, why: str = "changed while it was being read", role: str = "SRC") -> BadInput:
    """The one line for an input that is not the file it was when pinned."""
    return BadInput(f"{role} {why}: {path}; nothing was published; make sure nothing writes to it, then run again")
