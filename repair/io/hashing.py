"""Copy and hash in one pass, so recording sha256 of every file costs no extra read."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

CHUNK = 16 << 20


def copy_hashed(src_fd: int, dst_fd: int, offset: int, length: int, digest: "hashlib._Hash | None" = None) -> None:
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
        _kernel_copy(fin.fileno(), fout.fileno(), os.fstat(fin.fileno()).st_size)
    hasher.join()
    if isinstance(result.get("sha"), BaseException):
        raise result["sha"]
    return result["sha"]


def _sha256_or_error(path: Path):
    try:
        return sha256_file(path)
    except BaseException as exc:  # re-raised in the copying thread
        return exc


def _kernel_copy(src_fd: int, dst_fd: int, length: int) -> None:
    """copy_file_range until done; fall back to read/write where the kernel refuses (EXDEV, ENOSYS...)."""
    offset = 0
    try:
        while offset < length:
            sent = os.copy_file_range(src_fd, dst_fd, length - offset, offset)
            if sent == 0:
                raise EOFError(f"source ended {length - offset} bytes early")
            offset += sent
    except OSError as exc:
        if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EBADF):
            raise
        os.lseek(dst_fd, offset, os.SEEK_SET)
        copy_hashed(src_fd, dst_fd, offset, length - offset)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
