"""Copying and sha256 of whole files and byte ranges: the kernel copies, other threads hash from the page cache.

Only commands that write or fetch bytes import this module: header-only commands (`inspect`, `doctor`)
read headers through repair.io.safetensors, which does not import it, so they never load OpenSSL or ctypes.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import mmap
import os
import sys
import threading
from pathlib import Path

CHUNK = 16 << 20


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
    """Ask the kernel to start writing a just-written range to disk, without waiting (Linux
    sync_file_range WRITE; a no-op elsewhere). The fsync before publishing then finds most pages
    already clean instead of writing the whole output at the end."""
    fn = _sync_file_range()
    if fn is not None and length > 0:
        fn(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; errors only cost the head start


def copy_hashed(src_fd: int, dst_fd: int, offset: int, length: int, digest: hashlib._Hash | None = None) -> None:
    """Append `length` bytes of `src_fd` from `offset` to `dst_fd`, feeding them to `digest`."""
    buffer = bytearray(min(CHUNK, max(length, 1)))
    view = memoryview(buffer)
    while length:
        got = os.preadv(src_fd, [view[: min(length, CHUNK)]], offset)
        if got == 0:
            raise EOFError(f"source ended {length} bytes early")
        chunk = view[:got]
        if digest is not None:
            digest.update(chunk)
        write_all(dst_fd, chunk)
        offset += got
        length -= got


def write_all(fd: int, data: memoryview) -> None:
    while data:
        done = os.write(fd, data)
        data = data[done:]


def copy_file_hashed(src: Path, dst: Path) -> str:
    """Copy a whole file and return its sha256.

    The kernel copies (copy_file_range: no user-space round trip, reflinks where the file
    system can) while a second thread hashes the source from the page cache; both release the
    GIL, so on two cores this costs about max(copy, hash) instead of their sum.
    """
    result: dict[str, object] = {}
    hasher = threading.Thread(target=lambda: result.update(sha=_sha256_or_error(src)), daemon=True)
    hasher.start()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        kernel_copy(fin.fileno(), fout.fileno(), os.fstat(fin.fileno()).st_size, writeback=True)
    hasher.join()
    if isinstance(result.get("sha"), BaseException):
        raise result["sha"]
    return result["sha"]


def _sha256_or_error(path: Path):
    try:
        return sha256_file(path)
    except BaseException as exc:  # re-raised in the copying thread
        return exc


COPY_PIECE = 32 << 20  # bytes per copy_file_range call (then writeback starts, and hashing may follow)


def kernel_copy(src_fd: int, dst_fd: int, length: int, start: int = 0, writeback: bool = False, on_piece=None) -> None:
    """Append `length` bytes of `src_fd` from `start` at `dst_fd`'s position: copy_file_range until
    done, falling back to read/write where the kernel refuses (EXDEV, ENOSYS...)."""
    done = 0
    try:
        while done < length:
            sent = os.copy_file_range(src_fd, dst_fd, min(length - done, COPY_PIECE), start + done)
            if sent == 0:
                raise EOFError(f"source ended {length - done} bytes early")
            done += sent
            if writeback:
                start_writeback(dst_fd, done - sent, sent)  # whole-file copies: dst offsets equal src offsets
            if on_piece is not None:
                on_piece(sent)  # e.g. HashFollower.advance: hashing follows the copy piece by piece
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
            raise
        copy_hashed(src_fd, dst_fd, start + done, length - done)  # os.write continues at dst's position
        if on_piece is not None:
            on_piece(length - done)


class HashFollower:
    """sha256 of a file while it is being appended to, computed in a second thread.

    The writer calls `advance(n)` after each append; the thread reads the new bytes back (from
    the page cache, just written) and hashes them, so the writer can let the kernel copy
    (copy_file_range) and never touch the bytes itself. `finish()` waits and returns the digest.
    """

    def __init__(self, path: Path):
        self.digest = hashlib.sha256()
        self._fd = os.open(path, os.O_RDONLY)
        self._written, self._hashed, self._state = 0, 0, "open"  # open | finishing | cancelled
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=f"sha256 {Path(path).name}", daemon=True)
        self._thread.start()

    def advance(self, nbytes: int) -> None:
        with self._cond:
            self._written += nbytes
            if self._written - self._hashed >= CHUNK:
                self._cond.notify()

    def finish(self) -> hashlib._Hash:
        self._stop("finishing")
        if self._error is not None:
            raise self._error
        return self.digest

    def cancel(self) -> None:
        self._stop("cancelled")

    def _stop(self, state: str) -> None:
        with self._cond:
            self._state = state
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while self._state == "open" and self._written - self._hashed < CHUNK:
                        self._cond.wait()
                    if self._state == "cancelled":
                        return
                    target, last = self._written, self._state == "finishing"
                while self._hashed < target:
                    stop = min(target, self._hashed + CHUNK)
                    hash_range(self._fd, self.digest, self._hashed, stop)
                    start_writeback(self._fd, self._hashed, stop - self._hashed)
                    self._hashed = stop
                if last:
                    return
        except BaseException as exc:  # re-raised by finish() in the writer's thread
            self._error = exc
        finally:
            os.close(self._fd)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        hash_range(fh.fileno(), digest, 0, os.fstat(fh.fileno()).st_size)
    return digest.hexdigest()


def hash_range(fd: int, digest: hashlib._Hash, start: int, end: int) -> None:
    """Feed bytes [start, end) of `fd` to `digest` through 16 MiB read-only mappings of the page cache.

    Measured 1.76 GB/s against 1.24-1.47 GB/s for pread into a buffer (the copy costs a pass). The
    length is checked before each window: a file that got shorter raises EOFError (one truncated
    between that check and the read would raise SIGBUS; the input must not change during a run).
    """
    granule = mmap.ALLOCATIONGRANULARITY
    while start < end:
        base = start - start % granule
        stop = min(end, base + CHUNK)
        if os.fstat(fd).st_size < stop:
            raise EOFError(f"file ended {end - os.fstat(fd).st_size} bytes early")
        with mmap.mmap(fd, stop - base, offset=base, access=mmap.ACCESS_READ) as window:
            with memoryview(window) as view:
                digest.update(view[start - base:])
        start = stop
