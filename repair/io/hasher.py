"""One thread feeding digests (io/hashing.py): sha256 runs beside the writer (hashlib releases the GIL)."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from typing import Callable

CHUNK = 16 << 20  # bytes per copy / hash / write step (measured: 16 MiB costs less CPU than 4)
AHEAD = 64  # chunks the writer may copy ahead of the hashing (1 GiB: in the page cache, not in memory of ours); each
# holds a mapping of its output, and CPython's mmap holds a file descriptor of its own: AHEAD open files per thread
HELD = 2 * CHUNK  # bytes of written buffers (computed tensors) kept alive until hashed, per output file


class Hasher:
    """One thread feeding digests, job after job in submission order. The writer may run `AHEAD` chunks
    ahead of it (copied chunks hold no memory: they are hashed from the page cache, so the copy and its
    writeback are not held back by hashing), but buffers it holds for hashing stay under `HELD` bytes.
    An error in a job is raised by the next `submit` or by `drain`."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._error: BaseException | None = None
        self._pending, self._held = 0, 0
        self._room = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="sha256", daemon=True)
        try:
            self._thread.start()
        except BaseException:  # interrupted as it started: nobody holds this hasher to stop its thread
            self._jobs.put(None)
            raise

    def submit(self, job: Callable[[], None], held: int = 0) -> None:
        """Run `job` (it feeds a digest) after the jobs before it; `held`: the bytes of the buffer it keeps alive."""
        with self._room:
            while self._error is None and (self._pending >= AHEAD or (held and self._held and self._held + held > HELD)):
                self._room.wait()
            self._raise()
            self._pending += 1
            self._held += held
        self._jobs.put((job, held))

    def wait(self) -> None:
        """Wait until every job submitted so far is done, the thread still running (one hasher shared by several
        digests: one is finished while the others go on); raises a job's error. Nothing may submit meanwhile."""
        with self._room:
            while self._pending and self._error is None:
                self._room.wait()
        self._raise()

    def drain(self) -> None:
        """Wait until every job is hashed and stop the thread; raises a job's error."""
        self._jobs.put(None)  # always (a stopped thread reads no more): no interrupt lands between a check and the put
        self._thread.join()
        self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, held = item
            try:
                if self._error is None:
                    job()
            except BaseException as exc:  # re-raised in the writer's thread
                self._error = exc
            finally:
                item = job = None  # its buffer goes now, not when the next job comes: a whole computed tensor waited
                with self._room:
                    self._pending -= 1
                    self._held -= held
                    self._room.notify_all()


def shared_threads(files: int) -> int:
    """The hashing threads `SharedHashers` starts for `files` files."""
    return min(files, max(2, os.cpu_count() or 1))


class SharedHashers:
    """At most one hashing thread per core (two at least), shared round-robin by many digests: a count of files that
    comes from the input or the command line (`fix --tp 4096`, a manifest's tp) never asks for thousands of threads.
    `with` starts them, each with `held()` (io/staging.InterruptGate.held) so a signal waits until this object holds
    it, and drains them all on exit, whatever ends it; each digest waits for its own jobs (`Hasher.wait`)."""

    def __init__(self, files: int, held: Callable) -> None:
        self._count, self._held = shared_threads(files), held
        self._hashers: list[Hasher] = []

    def __enter__(self) -> "SharedHashers":
        """Starts the threads here, not in __init__: an interrupt before `with` holds the object starts none, and one
        between two starts stops those begun before it leaves."""
        try:
            for _ in range(self._count):
                with self._held():
                    self._hashers.append(Hasher())
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.stop()

    def of(self, number: int) -> Hasher:
        """The thread file `number` shares."""
        return self._hashers[number % len(self._hashers)]

    def stop(self) -> None:
        """Stops every thread after the jobs it holds (before the temp folder goes, or at the end)."""
        for hasher in self._hashers:
            with contextlib.suppress(BaseException):
                hasher.drain()
