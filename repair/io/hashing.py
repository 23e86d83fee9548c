"""Copy and hash in one pass, so recording sha256 of every file costs no extra read."""

from __future__ import annotations

import hashlib
import os
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
    """Copy a whole file and return its sha256."""
    digest = hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        copy_hashed(fin.fileno(), fout.fileno(), 0, os.fstat(fin.fileno()).st_size, digest)
    return digest.hexdigest()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
