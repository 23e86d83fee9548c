"""Where a checkpoint's tensor bytes come from: its own shard files, or (a Hub repo) a remote store whose local
mirror holds only the headers and the ranges fetched so far.

Readers stream whole tensors from many shards at once (`parallel_tensors`: a bounded pool, a bounded queue, so
memory holds a few tensors, never a shard), and ask `holds` before reading a local file where a hole may stand
for bytes never fetched.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from repair.errors import BadInput
from repair.io.safetensors import TensorInfo

Emit = Callable[[TensorInfo, bytes], None]
WORKERS = 2  # local shards read at once: the scan is CPU-bound past two readers on the machines this targets
_DONE = object()


@dataclass
class Transfer:
    """What reading cost: requests made (0 for local files) and bytes read or transferred."""

    requests: int = 0
    bytes: int = 0

    def add(self, requests: int, nbytes: int) -> None:
        self.requests += requests
        self.bytes += nbytes


class ByteSource(Protocol):
    """A checkpoint's tensor bytes where the shard files alone do not hold them all (`Checkpoint.byte_source`)."""

    where: str  # where the bytes come from, as messages name it ("the Hub")
    transfer: Transfer

    def holds(self, path: Path, start: int, end: int) -> bool:
        """Whether [start, end) of the local file `path` holds the real bytes (not a hole left unfetched)."""

    def tensors(self, infos: list[TensorInfo]) -> Iterator[tuple[TensorInfo, bytes]]:
        """Each tensor's bytes, shards in parallel with a bound, in no particular order; nothing is stored."""

    def store(self, infos: list[TensorInfo]) -> bool:
        """Fetch these tensors' bytes into the local files (the scales a plan-time check reads); True if any was."""


class LocalFiles:
    """A local checkpoint's own shard files: every byte is there."""

    where = "disk"

    def __init__(self) -> None:
        self.transfer = Transfer()

    def holds(self, path: Path, start: int, end: int) -> bool:
        return True

    def tensors(self, infos: list[TensorInfo]) -> Iterator[tuple[TensorInfo, bytes]]:
        return parallel_tensors(infos, self._read_shard, WORKERS)

    def store(self, infos: list[TensorInfo]) -> bool:
        return False

    def _read_shard(self, path: Path, infos: list[TensorInfo], emit: Emit) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
            for info in infos:
                data = os.pread(fd, info.nbytes, info.start)
                if len(data) != info.nbytes:
                    raise BadInput(f"{path}: {info.name}: file ended while reading; it is truncated, re-download it")
                self.transfer.add(0, len(data))
                emit(info, data)
        finally:
            os.close(fd)


def parallel_tensors(infos: list[TensorInfo], read_shard: Callable[[Path, list[TensorInfo], Emit], None],
                     workers: int, depth: int = 8) -> Iterator[tuple[TensorInfo, bytes]]:
    """`read_shard(path, its infos in file order, emit)` on `workers` threads, one shard each at a time; the
    emitted tensors are yielded here as they come (at most `depth` wait). A worker's error is raised here; when
    the consumer stops early, the workers stop at their next tensor."""
    shards: dict[Path, list[TensorInfo]] = {}
    for info in sorted(infos, key=lambda i: (str(i.path), i.start)):
        shards.setdefault(info.path, []).append(info)
    if not shards:
        return
    todo = queue.SimpleQueue()
    for item in shards.items():
        todo.put(item)
    out: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> None:
        while not stop.is_set():
            try:
                return out.put(item, timeout=0.1)
            except queue.Full:
                continue
        raise _Stopped

    def work() -> None:
        try:
            while not stop.is_set():
                try:
                    path, part = todo.get_nowait()
                except queue.Empty:
                    break
                read_shard(path, part, lambda info, data: put((info, data)))
        except _Stopped:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which raises it
            stop.set()
            out.put((exc, None))
            return
        out.put((_DONE, None))

    threads = [threading.Thread(target=work, daemon=True, name=f"tensor-reader-{i}") for i in range(min(workers, len(shards)))]
    for t in threads:
        t.start()
    running = len(threads)
    try:
        while running:
            first, data = out.get()
            if first is _DONE:
                running -= 1
            elif isinstance(first, BaseException):
                raise first
            else:
                yield first, data
    finally:
        stop.set()
        while any(t.is_alive() for t in threads):  # unblock workers waiting on a full queue, then wait for them
            try:
                out.get_nowait()
            except queue.Empty:
                pass
            for t in threads:
                t.join(timeout=0.05)


class _Stopped(Exception):
    """The consumer stopped reading: a worker leaves its shard."""
