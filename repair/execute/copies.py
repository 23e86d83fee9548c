"""Shards kept whole, copied ahead of their hashing: the disk never waits for the CPU (#27.3).

Each one is copied kernel to kernel, its writeback started as it goes (io/hashing.HashedOutput), by
one of `COPIERS` threads, which moves on to the next shard as soon as the copy is issued; the copied
file's own thread finishes its sha256 meanwhile, from the page cache. Digests are taken in plan
order. At most `AHEAD` copied shards wait for their hashing (each holds an open file and a thread),
so a checkpoint of 163 shards never holds 163; the turn of each copy is its place in the plan, so
the copy the writer waits for next is never the one left without room.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from repair.io.hashing import HashedOutput, copy_file_started
from repair.io.pins import PinnedFile

COPIERS = 2  # threads issuing copies (the kernel copies; more would only queue more writes)
AHEAD = 4  # copied shards whose hashing may still run (two per core here; each costs a thread and a file)


class WholeCopies:
    """Copies of whole input shards, started at once, in the order given; `digest(name)` in that order."""

    def __init__(self, jobs: dict[str, tuple[PinnedFile, Path]]):
        self._turns = {name: turn for turn, name in enumerate(jobs)}
        self._taken = 0  # digests taken so far: copy number `turn` may start once turn < taken + AHEAD
        self._stopped = False
        self._room = threading.Condition()
        self._pool = ThreadPoolExecutor(COPIERS, thread_name_prefix="ckpt-repair-copy")
        self._copies: dict[str, Future] = {
            name: self._pool.submit(self._copy, self._turns[name], src, dst) for name, (src, dst) in jobs.items()}

    def __enter__(self) -> "WholeCopies":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.stop()
        self._pool.shutdown(wait=True)

    def digest(self, name: str) -> str:
        """The sha256 of one shard as read and written: waits for its copy, then for its hashing."""
        out = self._copies.pop(name).result()
        try:
            return out.close()
        finally:
            with self._room:
                self._taken += 1
                self._room.notify_all()

    def stop(self) -> None:
        """After an error: copies not started are dropped, running ones finish, every copied file is closed
        and its hashing thread stopped before the temp folder goes."""
        with self._room:
            self._stopped = True
            self._room.notify_all()
        for copy in self._copies.values():
            copy.cancel()
        self._pool.shutdown(wait=True)
        for copy in self._copies.values():
            if not copy.cancelled() and copy.exception() is None and copy.result() is not None:
                copy.result().abort()

    def _copy(self, turn: int, src: PinnedFile, dst: Path) -> HashedOutput | None:
        with self._room:
            while not self._stopped and turn >= self._taken + AHEAD:
                self._room.wait()
            if self._stopped:
                return None
        return copy_file_started(src, dst)
