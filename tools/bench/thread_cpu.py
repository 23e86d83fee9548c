"""CPU seconds of each thread of one `fix` run: where the work is, whatever the machine's load.

    .venv/bin/python -m tools.bench.thread_cpu SRC OUT [fix flags...]   # prints JSON

Wall time on a shared 2-core machine says more about the other sessions than about `fix`. Thread CPU
time does not: a run on C cores cannot take less than max(the busiest thread, all threads / C), so
that bound, taken for `--jobs 1` and `--jobs 2` alike, gives the ratio an idle machine would show
(disk waits aside). Threads are grouped by role: main (planning, copying, writing in order), compute
(`--jobs` workers), sha256 (hashing), other. `start` is the main thread's CPU before the first computed
tensor (imports, plan): one core works alone until then, whatever `--jobs` is, so the tighter bound is
start + max(the busiest thread's rest, the rest / C).
"""

from __future__ import annotations

import json
import sys
import threading
import time

ROLES = (("ckpt-repair-compute", "compute"), ("sha256", "sha256"))


def _role(name: str) -> str:
    return next((role for prefix, role in ROLES if name.startswith(prefix)), "other")


def main() -> None:
    src, out, *flags = sys.argv[1:]
    spent: dict[str, list[float]] = {}
    lock = threading.Lock()
    run = threading.Thread.run

    def timed_run(self) -> None:
        try:
            run(self)
        finally:
            with lock:
                spent.setdefault(_role(self.name), []).append(time.thread_time())
    threading.Thread.run = timed_run
    wall = time.perf_counter()
    from repair.cli import main as cli
    from repair.execute.compute import Computer

    main_clock, start = time.pthread_getcpuclockid(threading.main_thread().ident), []
    unit_bytes = Computer.unit_bytes

    def first_noted(self, steps):
        if not start:
            start.append(time.clock_gettime(main_clock))
        return unit_bytes(self, steps)
    Computer.unit_bytes = first_noted

    try:
        cli(["fix", src, "-o", out, "--quiet", *flags])
    except SystemExit as stop:
        if stop.code:
            raise
    spent["main"] = [time.thread_time()]
    threads = {role: round(sum(v), 3) for role, v in spent.items()}
    total = sum(threads.values())
    print(json.dumps({"threads": threads, "busiest_thread": round(max(max(v) for v in spent.values()), 3),
                      "start": round(start[0] if start else spent["main"][0], 3),
                      "total": round(total, 3), "wall_in_process": round(time.perf_counter() - wall, 3)}))


if __name__ == "__main__":
    main()
