"""`unshard` of a `fix --tp 2` output of the 31B-assistant shape: this checkout against another (before a change),
and both against `cp -r` + `sync` of the same rank folder, alternated in one run (wall and CPU, same-run ratios).

    .venv/bin/python -m tools.bench.unshard OTHER_CHECKOUT [--repeats 5]

Each side runs `python -m repair unshard` with the same interpreter from its own folder (tools/bench/ab.py's way).
CPU is user + system of the whole process (/usr/bin/time), hashing threads included. The page cache is warm for
every contender; dirty pages are flushed before each run (measure.fresh). Wall time on a machine shared with other
sessions mostly measures them, so each side's CPU per thread is taken too (one in-process run, THREADS): a run on two
idle cores takes at least max(the main thread, the busiest other thread, all threads / 2). Prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tools.bench import inputs, measure
from tools.bench.measure import CLI, PY, REPO


def timed(cmd: str, cwd: Path) -> tuple[float, float]:
    """Wall and CPU (user + sys) seconds of one shell command; raises with its stderr on failure."""
    done = subprocess.run(["/usr/bin/time", "-f", "%e %U %S", "bash", "-c", cmd], capture_output=True, text=True, cwd=cwd)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({done.returncode}): {done.stderr[-3000:]}")
    wall, user, system = map(float, done.stderr.strip().splitlines()[-1].split())
    return wall, user + system


def contender(command, dst: Path, cwd: Path, samples: list):
    def run(d: Path) -> tuple[float, int]:
        wall, cpu = timed(command(d), cwd)
        samples.append(cpu)
        return wall, 0
    return measure.fresh(dst, run)


HASHED = "cp -r + sha256 of both + sync"  # what a tool recording both digests (#25) pays at least, one thread hashing
DIGESTS = "import hashlib, sys, pathlib; [hashlib.file_digest(open(f, \"rb\"), \"sha256\") for d in sys.argv[1:] for f in pathlib.Path(d).rglob(\"*\") if f.is_file()]"
THREADS = """
import json, sys, threading, time
from pathlib import Path
spent, run = [], threading.Thread.run
def timed(self):
    try:
        run(self)
    finally:
        spent.append(time.thread_time())
threading.Thread.run = timed
from repair.tp.unshard import unshard
unshard(Path(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({"main": time.thread_time(), "others": spent}))
"""


def thread_cpu(side: Path, tp: Path, out: Path) -> dict:
    """One in-process unshard from `side`: the main thread's CPU s, the busiest other thread's, and the total."""
    done = subprocess.run([PY, "-c", THREADS, str(tp), str(out)], capture_output=True, text=True, cwd=side, check=True,
                          env={**os.environ, "PYTHONPATH": str(side)})
    spent = json.loads(done.stdout.strip().splitlines()[-1])
    subprocess.run(["rm", "-rf", str(out)], check=True)
    total = spent["main"] + sum(spent["others"])
    return {"main": spent["main"], "busiest other": max(spent["others"], default=0.0), "total": total,
            "two-core bound": max(spent["main"], max(spent["others"], default=0.0), total / 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its repair/ imported through PYTHONPATH)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sides = {"this": REPO, "before": args.other.resolve()}
    measure.as_installed()  # both sides run from a bytecode cache, as installed packages do (an untimed run each fills it)
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-unshard-", dir="/tmp") as tmp:
        work = Path(tmp)
        src = inputs.build_31b(work / "a31b")
        subprocess.run([*CLI, "fix", str(src), "-o", str(work / "tp"), "--tp", "2", "--quiet"], check=True, cwd=REPO, capture_output=True)
        for side in sides.values():
            timed(f"PYTHONPATH={side} {PY} -m repair unshard {work / 'tp'} -o {work / 'warm'} && rm -rf {work / 'warm'}", side)
        cpu: dict[str, list[float]] = {name: [] for name in [*sides, "cp -r + sync"]}
        contenders = {f"unshard ({name})": contender(lambda d, side=side: f"PYTHONPATH={side} {PY} -m repair unshard {work / 'tp'} -o {d}",
                                                     work / f"out-{name}", side, cpu[name]) for name, side in sides.items()}
        contenders["cp -r + sync"] = contender(lambda d: f"cp -r {work / 'tp'} {d} && sync", work / "out-cp", REPO, cpu["cp -r + sync"])
        contenders[HASHED] = contender(lambda d: f"cp -r {work / 'tp'} {d} && {PY} -c '{DIGESTS}' {work / 'tp'} {d} && sync",
                                       work / "out-cp-hashed", REPO, cpu.setdefault(HASHED, []))
        load, started = measure.load(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        runs = measure.alternate(contenders, args.repeats)
        gb = inputs.size_bytes(work / "tp") / 1e9
        threads = {name: thread_cpu(side, work / "tp", work / "out-threads") for name, side in sides.items()}
    floor_wall, floor_cpu = runs["cp -r + sync"]["s"], statistics.median(cpu["cp -r + sync"])
    print(f"{started}, load {load} -> {measure.load()}, {args.repeats} alternated rounds, rank folder {gb:.2f} GB, {os.cpu_count()} cores\n")
    print("| contender | wall s (median) | wall / floor | CPU s (median) | CPU / floor | wall runs |")
    print("|---|---|---|---|---|---|")
    for name, key in [*((f"unshard ({n})", n) for n in sides), ("cp -r + sync", "cp -r + sync"), (HASHED, HASHED)]:
        wall, spent = runs[name]["s"], statistics.median(cpu[key])
        print(f"| {name} | {wall:.2f} | {wall / floor_wall:.2f}x | {spent:.2f} | {spent / floor_cpu:.2f}x | {runs[name]['runs']} |")
    print("\n| side | main thread CPU s | busiest other thread | all threads | bound on two idle cores |")
    print("|---|---|---|---|---|")
    for name, t in threads.items():
        print(f"| {name} | {t['main']:.2f} | {t['busiest other']:.2f} | {t['total']:.2f} | {t['two-core bound']:.2f} |")
    this, before = threads["this"]["two-core bound"], threads["before"]["two-core bound"]
    print(f"\nbound this / before: {this / before:.2f}x")


if __name__ == "__main__":
    main()
