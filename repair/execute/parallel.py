"""Computed tensors made ahead of the writer, on `jobs` threads, and handed back in the plan's order.

Dequantizing and requantizing are numpy and torch kernels that release the GIL, so threads use
every core without copying inputs or results between processes. The writer takes results in the
plan's order; at most `jobs` results exist at once (being computed, waiting, or being written), so
memory is bounded by `jobs` x the largest computed tensor (a requantized module's outputs count as
one: they come from one computation). Each unit is computed exactly as it is with one job, so the
output bytes are the same for every `jobs`.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

Unit = TypeVar("Unit")
Made = TypeVar("Made")
MAX_JOBS = 256  # beyond this, threads and held results cost memory and buy nothing on any machine we know


def default_jobs() -> int:
    """The cores this process may run on (a container's CPU set, not the host's count)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not Linux
        return max(1, os.cpu_count() or 1)


def in_order(units: Iterable[Unit], make: Callable[[Unit], Made], computed: Callable[[Unit], bool],
             jobs: int) -> Iterator[tuple[Unit, Made | None]]:
    """Each unit with `make(unit)` if `computed(unit)`, else None, in the order given.

    With jobs=1 everything runs on the caller's thread, one unit at a time. With more, computed
    units run on a pool `jobs` ahead of the one the caller holds; an error (or Ctrl-C) in the
    caller cancels what has not started and waits for what has (each at most one tensor's work).
    """
    jobs = min(jobs, MAX_JOBS)  # each job holds a result: a huge value must not hold the whole checkpoint
    if jobs <= 1:
        for unit in units:
            yield unit, make(unit) if computed(unit) else None
        return
    pool = ThreadPoolExecutor(jobs, thread_name_prefix="ckpt-repair-compute")
    window = _Window()
    try:
        for unit in units:
            window.add(unit, pool.submit(make, unit) if computed(unit) else None)
            if window.held >= jobs:
                yield from window.drain(until=jobs - 1)
        yield from window.drain(until=0)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


class _Window:
    """Units handed to the pool and not yet back, in order, with a count of the computed ones
    (kept, not recounted: a shard's copies between two computed tensors may number thousands)."""

    def __init__(self) -> None:
        self.units: deque[tuple[object, Future | None]] = deque()
        self.held = 0

    def add(self, unit, future: Future | None) -> None:
        self.units.append((unit, future))
        self.held += future is not None

    def drain(self, until: int) -> Iterator[tuple]:
        """Hand back units from the front until at most `until` computed ones remain."""
        while self.units and (self.held > until or self.units[0][1] is None):
            unit, future = self.units.popleft()
            self.held -= future is not None
            yield unit, future.result() if future is not None else None


def runs(items: Iterable[Unit], key: Callable[[Unit], object]) -> list[tuple[Unit, ...]]:
    """Consecutive items with the same key (not None) as one unit; every other item alone.

    A requantized module's outputs come from one computation, so they are one unit of work.
    """
    out: list[list[Unit]] = []
    last = None
    for item in items:
        k = key(item)
        if out and k is not None and k == last:
            out[-1].append(item)
        else:
            out.append([item])
        last = k
    return [tuple(run) for run in out]
