"""`unshard` of a `fix --tp 2` output of the 31B-assistant shape: this checkout against another (before a change),
and both against `cp -r` + `sync` of the same rank folder, alternated in one run (wall and CPU, same-run ratios).

    .venv/bin/python -m tools.bench.unshard OTHER_CHECKOUT [--repeats 5]

Each side runs `python -m repair unshard` with the same interpreter from its own folder (tools/bench/ab.py's way).
CPU is user + system of the whole process (/usr/bin/time), hashing threads included. The page cache is warm for
every contender; dirty pages are flushed before each run (measure.fresh). Prints a markdown table.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its repair/ imported through PYTHONPATH)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    sides = {"this": REPO, "before": args.other.resolve()}
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-unshard-", dir="/tmp") as tmp:
        work = Path(tmp)
        src = inputs.build_31b(work / "a31b")
        subprocess.run([*CLI, "fix", str(src), "-o", str(work / "tp"), "--tp", "2", "--quiet"], check=True, cwd=REPO, capture_output=True)
        cpu: dict[str, list[float]] = {name: [] for name in [*sides, "cp -r + sync"]}
        contenders = {f"unshard ({name})": contender(lambda d, side=side: f"PYTHONPATH={side} {PY} -m repair unshard {work / 'tp'} -o {d}",
                                                     work / f"out-{name}", side, cpu[name]) for name, side in sides.items()}
        contenders["cp -r + sync"] = contender(lambda d: f"cp -r {work / 'tp'} {d} && sync", work / "out-cp", REPO, cpu["cp -r + sync"])
        load, started = measure.load(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        runs = measure.alternate(contenders, args.repeats)
        gb = inputs.size_bytes(work / "tp") / 1e9
    floor_wall, floor_cpu = runs["cp -r + sync"]["s"], statistics.median(cpu["cp -r + sync"])
    print(f"{started}, load {load} -> {measure.load()}, {args.repeats} alternated rounds, rank folder {gb:.2f} GB, {os.cpu_count()} cores\n")
    print("| contender | wall s (median) | wall / floor | CPU s (median) | CPU / floor | wall runs |")
    print("|---|---|---|---|---|---|")
    for name, key in [*((f"unshard ({n})", n) for n in sides), ("cp -r + sync", "cp -r + sync")]:
        wall, spent = runs[name]["s"], statistics.median(cpu[key])
        print(f"| {name} | {wall:.2f} | {wall / floor_wall:.2f}x | {spent:.2f} | {spent / floor_cpu:.2f}x | {runs[name]['runs']} |")


if __name__ == "__main__":
    main()
