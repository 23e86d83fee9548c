"""Reading tensors' bytes by byte range (pread): one tensor, or many small ones from few files.

A shard opened by `open_checkpoint` carries its pinned handle (io/pins.py): `source_of` gives it, so
the executor never reopens a path; a shard without one (a Hub mirror, our own output) is opened here.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, NamedTuple

from repair.errors import BadInput
from repair.io.pins import PinnedFile

if TYPE_CHECKING:
    from repair.io.safetensors import ShardHeader, TensorInfo

PREFETCH_GAP = 4096  # bytes between two prefetched tensors read through rather than skipped
PREFETCH_RUN = 1 << 20  # the most one prefetch read takes


def source_of(shard: ShardHeader) -> PinnedFile:
    """The handle every byte of `shard` is read through: the one pinned at plan time, else opened now."""
    return shard.file if shard.file is not None else PinnedFile(shard.path)


def read_tensor(shard: ShardHeader, info: TensorInfo) -> bytearray:
    """One tensor's bytes, through the shard's pinned handle."""
    return read_part(shard, source_of(shard), info, 0, info.nbytes)


def read_part(shard: ShardHeader, source: PinnedFile, info: TensorInfo, offset: int, length: int) -> bytearray:
    """`length` bytes of one tensor from `offset` inside it, through `source` (its shard's handle, taken once by a
    caller reading the tensor part by part)."""
    try:
        return source.read(info.start + offset, length)
    except EOFError:
        raise BadInput(f"{shard.path}: {info.name}: file ended while reading; it is truncated, re-download it") from None


def read_bytes(path: Path, info: TensorInfo) -> bytearray:
    """Read exactly one tensor's bytes by offset (pread), nothing else."""
    with open(path, "rb") as fh:
        return _pread(fh.fileno(), path, info)


class RangeReader:
    """`read_bytes` for many small reads: each file is opened once, not once per tensor (doctor reads
    two scales per packed module, ~90k reads on a DeepSeek-sized checkpoint), and tensors `prefetch`ed are
    read a run at a time and then served from memory. Closes the files on exit."""

    def __init__(self) -> None:
        self._files: dict[Path, int] = {}
        self._ahead: dict[tuple[Path, int, int], bytes] = {}

    def __call__(self, path: Path, info: TensorInfo) -> bytes | bytearray:
        found = self._ahead.get((path, info.start, info.nbytes))
        if found is not None:
            return found
        fd = self._fd(path)
        data = os.pread(fd, info.nbytes, info.start)  # scales are small: one call gives them whole
        return data if len(data) == info.nbytes else _pread(fd, path, info)

    def span(self, path: Path, start: int, end: int, name: str) -> bytes | bytearray:
        """The bytes [start, end) of `path`, part of the tensor `name` (named when the file ends early)."""
        fd = self._fd(path)
        data = os.pread(fd, end - start, start)
        return data if len(data) == end - start else _pread(fd, path, _Span(name, start, end))

    def prefetch(self, infos: Iterable[TensorInfo], gap: int = PREFETCH_GAP) -> None:
        """Read these small tensors ahead, one pread per run of them at most `gap` bytes apart and at most
        PREFETCH_RUN long (a shard's scalars sit together: safetensors' writer puts float32 tensors first)."""
        by_path: dict[Path, list[TensorInfo]] = {}
        for info in infos:
            by_path.setdefault(info.path, []).append(info)
        for path, group in by_path.items():
            group.sort(key=lambda i: i.start)
            run = [group[0]]
            for info in group[1:]:
                if info.start - run[-1].end <= gap and info.end - run[0].start <= PREFETCH_RUN:
                    run.append(info)
                else:
                    self._fill(path, run)
                    run = [info]
            self._fill(path, run)

    def _fill(self, path: Path, run: list[TensorInfo]) -> None:
        start, end = run[0].start, max(i.end for i in run)
        data = os.pread(self._fd(path), end - start, start)
        if len(data) == end - start:  # else (a file that ends early) each read says so when it is asked
            self._ahead.update(((path, i.start, i.nbytes), data[i.start - start:i.end - start]) for i in run)

    def _fd(self, path: Path) -> int:
        fd = self._files.get(path)
        if fd is None:
            fd = self._files[path] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        return fd

    def __enter__(self) -> "RangeReader":
        return self

    def __exit__(self, *exc) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()
        self._ahead.clear()


class _Span(NamedTuple):
    """The part of a tensor a short read names (what `_pread` needs of a TensorInfo)."""

    name: str
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


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
