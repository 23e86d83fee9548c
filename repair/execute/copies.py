"""Shards kept whole, copied ahead of their hashing: the disk never waits for the CPU (#27.3).

Each one is copied kernel to kernel, its writeback started as it goes (io/hashing.HashedOutput), by
one of `COPIERS` threads, which moves on to the next shard as soon as the copy is issued; the copied
file's own thread finishes its sha256 meanwhile, from the page cache. Digests are taken in plan
order. At most `AHEAD` copied shards wait for their hashing, and beyond one per copier at most
`AHEAD_BYTES` together: each holds an open file and a thread, and its bytes must stay in the page
cache until hashed (else hashing reads them back from the disk). The copy the writer waits for next
always starts, so none is ever left without room.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from repair.io.hashing import HashedOutput, copy_file_started
from repair.io.pins import PinnedFile

COPIERS = 2  # threads issuing copies (the kernel copies; more would only queue more writes)
AHEAD = 4  # copied shards whose hashing may still run (two per core here; each costs a thread and a file)
AHEAD_BYTES = 4 << 30  # and their bytes: ~2 s of this disk's writes, a sixth of this machine's page cache


class WholeCopies:
    """Copies of whole input shards, started at once by `with`, in the order given; `digest(name)` in that order.

    `finish`: each copier waits for its copy's hashing itself, so a finished copy holds no thread, file or page-cache
    claim, and every copy may finish ahead of the writer (`fix --tp`, `unshard`: small files, whose digests are
    taken only once the tensors are written). The copies still run on at most `COPIERS` threads, off the writer's.
    """

    def __init__(self, jobs: dict[str, tuple[PinnedFile, Path]], *, finish: bool = False):
        self._finish = finish
        self._turns = {name: turn for turn, name in enumerate(jobs)}
        self._taken = 0  # digests taken so far, in order: copy number `taken` is the one the writer needs next
        self._ahead = 0  # bytes of the copies started whose digest is not taken yet
        self._sizes = {name: src.size for name, (src, _) in jobs.items()}
        self._stopped = False
        self._room = threading.Condition()
        self._started: list[HashedOutput] = []  # every copy made, whether or not its Future was kept: stop() closes them
        self._jobs = jobs
        self._threads = f"ckpt-repair-copy-{id(self):x}"  # this pool's threads' names start so (stop() joins them)
        self._pool = ThreadPoolExecutor(COPIERS, thread_name_prefix=self._threads)
        self._copies: dict[str, Future] = {}

    def __enter__(self) -> "WholeCopies":
        """Starts the copies here, not in __init__: an interrupt before `with` holds the object starts none, and one
        between two submissions (no __exit__ runs then) stops those begun before it leaves."""
        try:
            for name, (src, dst) in self._jobs.items():
                self._copies[name] = self._pool.submit(self._copy, self._turns[name], src, dst)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self._copies:  # a copy whose digest nobody takes would wait for room forever
            self.stop()
        self._pool.shutdown(wait=True)

    def digest(self, name: str) -> str:
        """The sha256 of one shard as read and written: waits for its copy, then for its hashing."""
        out = self._copies[name].result()  # kept listed until in hand: interrupted here, stop() still closes it
        del self._copies[name]
        try:
            return out.close()
        finally:
            with self._room:
                self._taken += 1
                self._ahead -= self._sizes[name]
                self._room.notify_all()

    def stop(self) -> None:
        """After an error: copies not started are dropped, running ones finish, every copied file is closed
        and its hashing thread stopped before the temp folder goes."""
        with self._room:
            self._stopped = True
            self._room.notify_all()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for thread in threading.enumerate():  # a Ctrl-C inside submit() can start a thread the pool never lists
            if thread.name.startswith(self._threads + "_") and thread is not threading.current_thread():
                _join(thread)
        for out in self._started:
            out.abort()

    def _copy(self, turn: int, src: PinnedFile, dst: Path) -> HashedOutput | _Hashed | None:
        with self._room:
            while not (self._stopped or self._may_start(turn, src.size)):
                self._room.wait()
            if self._stopped:
                return None
            self._ahead += src.size
        out = copy_file_started(src, dst)
        with self._room:  # stop() waits for every running copy, then closes each one listed here
            self._started.append(out)
        return _Hashed(out.close()) if self._finish else out

    def _may_start(self, turn: int, size: int) -> bool:
        return self._finish or turn < self._taken + COPIERS or (turn < self._taken + AHEAD and self._ahead + size <= AHEAD_BYTES)


class _Hashed:
    """A copy its copier closed (`finish`): only its sha256 is left to take."""

    def __init__(self, digest: str):
        self._digest = digest

    def close(self) -> str:
        return self._digest


def _join(thread: threading.Thread) -> None:
    """Join a thread whose start() an interrupt cut short: the system thread exists, and it reports started soon
    (a thread that never does runs nothing, and is not waited for past a few seconds)."""
    for _ in range(5000):
        try:
            return thread.join()
        except RuntimeError:  # "cannot join thread before it is started"
            time.sleep(0.001)
