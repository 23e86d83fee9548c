"""Writing files hashed in one pass: every input byte is read once, and every output byte hashed as written.

The sha256 a report records for a written file is computed over exactly the bytes written, and an
input's over exactly the bytes read: the report cannot disagree with the files, whatever happens to the
input meanwhile. Hashing runs in a second thread (hashlib releases the GIL) while the writer copies the next
chunk, and writeback starts behind the writes (sync_file_range): the final fsync finds clean pages.

Only commands that write or fetch bytes import this module: header-only commands (`inspect`, `doctor`)
read headers through repair.io.safetensors, which does not import it, so they never load OpenSSL or ctypes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import mmap
import os
import sys
from pathlib import Path

from repair.io.hasher import CHUNK, Hasher
from repair.io.pins import PinnedFile

_SYNC_FILE_RANGE: list = []  # [libc sync_file_range or None], resolved on first use


def _sync_file_range():
    if not _SYNC_FILE_RANGE:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            except (OSError, AttributeError):
                fn = None
        _SYNC_FILE_RANGE.append(fn)
    return _SYNC_FILE_RANGE[0]


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing a just-written range to disk, without waiting for it (Linux
    sync_file_range WRITE; a no-op elsewhere). The fsync before publishing then finds most pages clean."""
    fn = _sync_file_range()
    if fn is not None and length > 0:
        fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; errors only cost the head start


def write_all(fd: int, data: memoryview, at: int) -> None:
    """All of `data` at offset `at` (pwrite: the file position is never used, so threads may write at once)."""
    while data:
        done = os.pwrite(fd, data, at)
        data, at = data[done:], at + done


class SourceDigest:
    """sha256 of an input file over the bytes read, computed in its own thread (beside the output's, so two
    cores hash at once). Copied chunks are fed in file order, read back from the output they were copied
    into (the bytes read are the bytes written); bytes the copy does not read (the header, changed tensors)
    are read through the pinned handle as they are passed. A copy that goes back in the file makes it hash
    the whole file again at the end, through the same handle."""

    def __init__(self, pinned: PinnedFile, head=None, at: int = 0, hasher: Hasher | None = None):
        """`head`: a sha256 already fed the file's bytes [0, at) (a header hashed as it was parsed: read once).
        `hasher`: a thread shared with other digests, which its owner drains (unshard: a bounded number for any tp)."""
        self.pinned, self._at, self._ordered = pinned, at, True
        self._digest = head if head is not None else hashlib.sha256()
        self._shared = hasher is not None
        self._hasher = hasher if hasher is not None else Hasher()

    def copied(self, offset: int, written: memoryview) -> None:
        """Bytes [offset, offset + len(written)) of the input, as the copy wrote them (`written_view`)."""
        self._hasher.submit(lambda: self._update(offset, written))

    def read(self, offset: int, data) -> None:
        """Bytes of the input at `offset` the writer read into a buffer (not changed afterwards)."""
        view = memoryview(data).cast("B")
        self._hasher.submit(lambda: self._update(offset, view), view.nbytes)

    def _update(self, offset: int, view: memoryview) -> None:
        if self._ordered and offset >= self._at:
            self._fill(offset)
            self._digest.update(view)
            self._at = offset + view.nbytes
        else:
            self._ordered = False

    def _fill(self, end: int) -> None:
        if end > self._at:
            hash_pinned(self.pinned, self._digest, self._at, end)
            self._at = end

    def hexdigest(self) -> str:
        """Waits for the copied chunks, then hashes what is left of the file."""
        if self._shared:
            self._hasher.wait()
        else:
            self._hasher.drain()
        if not self._ordered:
            self._digest, self._at, self._ordered = hashlib.sha256(), 0, True
        self._fill(self.pinned.size)
        return self._digest.hexdigest()

    def abort(self) -> None:
        if not self._shared:
            with contextlib.suppress(BaseException):
                self._hasher.drain()


def written_view(fd: int, at: int, n: int) -> memoryview:
    """Bytes [at, at + n) of our own output as written, through a read-only mapping of its page cache (measured
    cheaper than pread); one mapping feeds both digests of a copied chunk and is unmapped after the last. Only our
    own temp files are mapped: an input truncated while mapped would kill the process with SIGBUS."""
    base = at - at % mmap.ALLOCATIONGRANULARITY
    return memoryview(mmap.mmap(fd, at + n - base, offset=base, access=mmap.ACCESS_READ))[at - base:]


class HashedOutput:
    """A file being written, hashed over exactly the bytes written.

    Computed bytes are hashed from the buffer they are written from. Copied bytes go kernel to kernel
    (copy_file_range: read once, never through Python) and are hashed as they now are in the output,
    read back from the page cache by the hashing thread: the bytes hashed are the bytes written, and,
    for a source being hashed too (`SourceDigest`), the bytes read. Measured against reading into a
    buffer, hashing it and writing it, this costs less CPU (BENCHMARKS.md, "One pass").
    """

    def __init__(self, path: Path, hasher: Hasher | None = None):
        """`hasher`: a thread shared with other files, which its owner stops (io/hasher.SharedHashers: `fix --tp`)."""
        self.path = Path(path)
        self.digest = hashlib.sha256()
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self.written = 0
        self._shared = hasher is not None
        try:
            self._hasher = hasher if hasher is not None else Hasher()
        except BaseException:  # interrupted before the caller holds the file: closed here
            os.close(self.fd)
            raise

    def write(self, data, placed: bool = False) -> None:
        """Append `data` (not changed afterwards: it is hashed while later chunks are written); placed: `place` wrote it."""
        view = memoryview(data).cast("B")
        for start in range(0, view.nbytes, CHUNK):
            piece = view[start:start + CHUNK]
            self._hasher.submit(lambda piece=piece: self.digest.update(piece), piece.nbytes)
            if not placed:
                write_all(self.fd, piece, self.written)
            self._advance(piece.nbytes)

    def place(self, data, at: int) -> None:
        """Write `data` at `at` ahead of the appending, from any thread (each `--jobs` worker copies its own result
        into the page cache); `write(data, placed=True)` hashes it when the appending reaches `at`."""
        write_all(self.fd, memoryview(data).cast("B"), at)

    def copy(self, src: PinnedFile, offset: int, length: int, source: SourceDigest | None = None) -> None:
        """Append `length` bytes of `src` from `offset`, then hash them as written (read back)."""
        source = source if source is not None and source.pinned is src else None
        while length:
            n, at = min(length, CHUNK), self.written
            if self._kernel_copy(src, offset, n, at):
                written = written_view(self.fd, at, n)
                self._hasher.submit(lambda written=written: self.digest.update(written))
                self._advance(n)
                if source is not None:
                    source.copied(offset, written)
            else:  # the kernel cannot copy here (another file system...): through a buffer
                data = src.read(offset, n)
                self.write(data)
                if source is not None:
                    source.read(offset, data)
            offset += n
            length -= n

    def copy_at(self, src: PinnedFile, offset: int, length: int, at: int, source: SourceDigest | None = None) -> None:
        """Copy `length` bytes of `src` from `offset` to `at`, ahead of the appending (`placed` hashes them when it
        reaches them); `source` is fed them as written there (`unshard` in a rank file's order, not the output's)."""
        source = source if source is not None and source.pinned is src else None
        while length:
            n = min(length, CHUNK)
            if self._kernel_copy(src, offset, n, at):
                if source is not None:
                    source.copied(offset, written_view(self.fd, at, n))
            else:
                data = src.read(offset, n)
                write_all(self.fd, memoryview(data).cast("B"), at)
                if source is not None:
                    source.read(offset, data)
            offset, at, length = offset + n, at + n, length - n

    def placed(self, n: int) -> None:
        """Append past `n` bytes written ahead (`copy_at`, `place`), hashing them as they now are in the file."""
        while n:
            k = min(n, CHUNK)
            written = written_view(self.fd, self.written, k)
            self._hasher.submit(lambda written=written: self.digest.update(written))
            self._advance(k)
            n -= k

    def _kernel_copy(self, src: PinnedFile, offset: int, n: int, at: int) -> bool:
        done = 0
        try:
            while done < n:
                sent = os.copy_file_range(src.fd, self.fd, n - done, offset + done, at + done)
                if sent == 0:
                    raise EOFError(f"{src.path}: ended {n - done} bytes early")
                done += sent
        except OSError as exc:
            if done or exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
                raise
            return False
        return True

    def _advance(self, n: int) -> None:
        start_writeback(self.fd, self.written, n)
        self.written += n

    def close(self) -> str:
        """Wait for the hashing, close the file (once: a closed fd's number may be another file's); the sha256 written."""
        try:
            self._hasher.wait() if self._shared else self._hasher.drain()
        finally:
            fd, self.fd = self.fd, -1
            if fd >= 0:
                os.close(fd)
        return self.digest.hexdigest()

    def abort(self) -> None:
        with contextlib.suppress(BaseException):
            self.close()


def copy_file_started(src: PinnedFile, dst: Path) -> HashedOutput:
    """Copy a pinned input file whole; returns with its hashing still running (`close()` gives the sha256)."""
    out = HashedOutput(dst)
    try:
        out.copy(src, 0, src.size)
    except BaseException:
        out.abort()
        raise
    return out


def sha256_pinned(pinned: PinnedFile) -> str:
    """sha256 of an input over the bytes read through its pinned handle: the bytes kept when it was read
    whole (a config: the bytes parsed), else read now (no mapping: a file truncated meanwhile raises
    EOFError, where a mapped read would kill the process with SIGBUS)."""
    if pinned.content is not None:
        return hashlib.sha256(pinned.content).hexdigest()
    digest = hashlib.sha256()
    hash_pinned(pinned, digest, 0, pinned.size)
    return digest.hexdigest()


def hash_pinned(pinned: PinnedFile, digest, start: int, end: int) -> None:
    buffer = bytearray(min(CHUNK, max(end - start, 1)))
    while start < end:
        view = memoryview(buffer)[:min(CHUNK, end - start)]
        pinned.read_into(start, view)
        digest.update(view)
        start += view.nbytes


def hash_fd(fd: int, digest, start: int, end: int) -> None:
    """Feed bytes [start, end) of an open file to `digest` by pread (no mapping: see sha256_pinned)."""
    buffer = bytearray(min(CHUNK, max(end - start, 1)))
    while start < end:
        got = os.preadv(fd, [memoryview(buffer)[:min(CHUNK, end - start)]], start)
        if got == 0:
            raise EOFError(f"file ended {end - start} bytes early")
        digest.update(memoryview(buffer)[:got])
        start += got


def sha256_file(path: Path) -> str:
    """sha256 of a file by path: our own output (written JSON) or a download, never a pinned input."""
    return sha256_pinned(PinnedFile(path))
