"""Reading tensors' bytes by byte range (pread): one tensor, or many small ones from few files.

A shard opened by `open_checkpoint` carries its pinned handle (io/pins.py): `source_of` gives it, so
the executor never reopens a path; a shard without one (a Hub mirror, our own output) is opened here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from repair.errors import BadInput
from repair.io.pins import PinnedFile

if TYPE_CHECKING:
    from repair.io.safetensors import ShardHeader, TensorInfo


def source_of(shard: ShardHeader) -> PinnedFile:
    """The handle every byte of `shard` is read through: the one pinned at plan time, else opened now."""
    return shard.file if shard.file is not None else PinnedFile(shard.path)


def read_tensor(shard: ShardHeader, info: TensorInfo) -> bytearray:
    """One tensor's bytes, through the shard's pinned handle."""
    try:
        return source_of(shard).read(info.start, info.nbytes)
    except EOFError:
        raise BadInput(f"{shard.path}: {info.name}: file ended while reading; it is truncated, re-download it") from None


def read_bytes(path: Path, info: TensorInfo) -> bytearray:
    """Read exactly one tensor's bytes by offset (pread), nothing else."""
    with open(path, "rb") as fh:
        return _pread(fh.fileno(), path, info)


class RangeReader:
    """`read_bytes` for many small reads: each file is opened once, not once per tensor (doctor reads
    two scales per packed module, ~90k reads on a DeepSeek-sized checkpoint). Closes them on exit."""

    def __init__(self) -> None:
        self._files: dict[Path, int] = {}

    def __call__(self, path: Path, info: TensorInfo) -> bytes | bytearray:
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        data = os.pread(fd, info.nbytes, info.start)  # scales are small: one call gives them whole
        return data if len(data) == info.nbytes else _pread(fd, path, info)

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


def _pread(fd: int, path: Path, info: TensorInfo) -> bytearray:
    buffer = bytearray(info.nbytes)
    view = memoryview(buffer)
    done = 0
    while done < info.nbytes:
        got = os.preadv(fd, [view[done:]], info.start + done)
        if got == 0:
            raise BadInput(f"{path}: {info.name}: file ended while reading; it is truncated, re-download it")
        done += got
    return buffer
