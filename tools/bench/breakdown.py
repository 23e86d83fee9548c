"""Where one `fix` process's wall time goes, stage by stage, with each stage's main-thread CPU beside it.

    T0=$(date +%s.%N) python -m tools.bench.breakdown SRC OUT [fix flags...]   # prints JSON

Stages, in order: interpreter start (T0, taken by the shell just before the exec, to the first line here),
imports, opening the source (headers), the plan (doctor before included for --target), the write (copy,
compute, both sha256s), self-check, doctor after, report, fsync, publish, printing. Each stage's wall time
is the main thread's; its CPU (time.thread_time) says how much of that wall was the stage working rather
than waiting (for the hashing threads, or for a core another process holds). The hashing threads' CPU and
the moment their last digest was done are reported separately: they overlap the write. Run it with a
bytecode cache (PYTHONPYCACHEPREFIX, PYTHONDONTWRITEBYTECODE unset) to measure what an installed package does.
"""

from __future__ import annotations

import time

_WALL0, _CPU0 = time.time(), time.thread_time()

import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

STAGES: list[tuple[str, float, float]] = []  # (stage, wall s, main-thread CPU s), in the order they ran


def _clock() -> tuple[float, float]:
    return time.time(), time.thread_time()


def stage(name: str, begun: tuple[float, float]) -> tuple[float, float]:
    now = _clock()
    STAGES.append((name, now[0] - begun[0], now[1] - begun[1]))
    return now


_DEPTH = [0]


def timed(owner, attr: str, name: str) -> None:
    """Count calls of owner.attr made on the main thread as stage `name`; a call inside another timed stage
    (write_json of a config inside the write) counts in that outer stage."""
    real = getattr(owner, attr)

    def wrapper(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread() or _DEPTH[0]:
            return real(*args, **kwargs)
        begun = _clock()
        _DEPTH[0] += 1
        try:
            return real(*args, **kwargs)
        finally:
            _DEPTH[0] -= 1
            stage(name, begun)
    setattr(owner, attr, wrapper)


def _hash_threads(ends: list[float], cpu: list[float]) -> None:
    """Record each sha256 thread's CPU and the time it finished."""
    run = threading.Thread.run

    def recorded(self) -> None:
        try:
            run(self)
        finally:
            if self.name.startswith("sha256"):
                ends.append(time.time())
                cpu.append(time.thread_time())
    threading.Thread.run = recorded


def main() -> None:
    src, out, *flags = sys.argv[1:]
    t0 = float(os.environ.get("T0", _WALL0))
    STAGES.append(("interpreter start", _WALL0 - t0, _CPU0))
    ends, cpu = [], []
    _hash_threads(ends, cpu)
    begun = _clock()
    import repair.api  # noqa: F401  (what `fix` imports before its first computed tensor)
    import repair.cli.fix_cmd, repair.cli.main, repair.cli.sources, repair.hub.source, repair.io.hashing  # noqa: E401,F401
    import repair.execute.writer as writer
    import repair.io.atomic as atomic
    import repair.planning.text  # noqa: F401
    stage("imports", begun)
    import repair.api as api_mod
    import repair.cli.fix_cmd as fix_cmd
    import repair.cli.sources as sources
    timed(sources, "open_source", "open source (headers)")
    timed(api_mod, "plan", "plan (doctor before for --target)")
    timed(writer, "_write_all", "write (copy, compute, both sha256s)")
    timed(writer, "_self_check", "self-check")
    timed(writer, "build_report", "report (build)")
    timed(writer, "write_json", "report (write)")
    timed(atomic, "apply_modes", "modes")
    timed(atomic, "fsync_tree", "fsync")
    timed(atomic, "publish", "publish (rename)")
    timed(fix_cmd, "say", "print")
    real_run = api_mod.run

    def run_with_after(plan, out_, **kw):  # doctor after: the `after` callback execute() gets calls diagnose_each
        timed(api_mod, "diagnose_each", "doctor after")
        return real_run(plan, out_, **kw)
    api_mod.run = run_with_after
    from repair.cli import main as cli
    begun = _clock()
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the summary line: this prints JSON alone
            cli(["fix", src, "-o", out, "--quiet", *flags])
    except SystemExit as stop:
        if stop.code:
            raise
    end = _clock()
    accounted = sum(w for n, w, _ in STAGES[1:])  # stages after the interpreter's start
    total = end[0] - t0
    result = {"stages": [{"stage": n, "wall": round(w, 4), "main_cpu": round(c, 4)} for n, w, c in _merged()],
              "other (main thread, between stages)": round(total - STAGES[0][1] - accounted, 4),
              "wall_total": round(total, 4), "main_cpu_total": round(end[1], 4),
              "sha256_threads_cpu": round(sum(cpu), 4), "last_sha256_done_at": round(max(ends) - t0, 4) if ends else None,
              "load": os.getloadavg()}
    print(json.dumps(result, indent=1))


def _merged() -> list[tuple[str, float, float]]:
    """Stages of the same name summed, in order of first appearance."""
    merged: dict[str, list[float]] = {}
    for name, wall, cpu in STAGES:
        merged.setdefault(name, [0.0, 0.0])
        merged[name][0] += wall
        merged[name][1] += cpu
    return [(n, w, c) for n, (w, c) in merged.items()]


if __name__ == "__main__":
    main()
