"""`doctor --target a,b,c` against one target on the 31B-shape assistant (#28.3: at most 1.2x, same run).

    .venv/bin/python tools/benchmark.py --only multitarget     # rewrites section 10 of BENCHMARKS.md only

The input is the buggy export at the real 31B assistant's shapes (0.65 GB, one shard, pre/post_projection
packed), so every target has something to say. Both contenders are whole `doctor` processes, alternated.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from tools.bench import measure
from tools.bench.measure import CLI, REPO

HEADING = "## 10. "
TARGET = 1.2  # three targets at most this multiple of one
ONE = "vllm==0.32.0"
THREE = "vllm==0.32.0,sglang==0.5.23,trtllm==1.2.0"  # the three runtimes of #28.3's example, each its own rules file


def bench_multitarget(work: Path, repeats: int, r: dict) -> None:
    from repair.demo.examples import GEMMA4_31B, write_assistant

    started, load_start = time.time(), measure.load()
    src = write_assistant(work / "a31b-broken", GEMMA4_31B, broken=True)
    several = THREE
    runs = measure.alternate({f"--target {ONE}": lambda: _doctor(src, ONE), f"--target {several}": lambda: _doctor(src, several),
                              f"--target {several} --json": lambda: _doctor(src, several, "--json")}, repeats)
    inside = in_process(src, (ONE, several), 3 * repeats)
    shutil.rmtree(src, ignore_errors=True)
    r["multitarget"] = {"one": ONE, "three": several, "runs": runs, "in_process": inside, "repeats": repeats, "load_start": load_start,
                        "load_end": measure.load(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
                        "minutes": (time.time() - started) / 60}


def in_process(src: Path, specs: tuple[str, ...], repeats: int) -> dict[str, float]:
    """What the targets add, without the process start: median seconds from opening the checkpoint to the text,
    alternated, a fresh Checkpoint each time (nothing read before is reused)."""
    import statistics

    from repair.doctor.diagnose import diagnose
    from repair.doctor.side_by_side import verdicts_text
    from repair.io.checkpoint import open_checkpoint
    from repair.targets.profiles import resolve_many

    times: dict[str, list[float]] = {s: [] for s in specs}
    for _ in range(repeats):
        for spec in specs:
            start = time.perf_counter()
            ckpt = open_checkpoint(src)
            verdicts_text(tuple(diagnose(ckpt, t) for t in resolve_many(spec)))
            times[spec].append(time.perf_counter() - start)
    return {s: statistics.median(v) for s, v in times.items()}


def _doctor(src: Path, targets: str, *flags: str) -> tuple[float, int]:
    """One doctor process; exit 1 (problems found) is its answer, not a failure."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *CLI, "doctor", str(src), "--target", targets, *flags],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr[-2000:])
    return time.perf_counter() - start, int(done.stderr.strip().splitlines()[-1])


def multitarget_section(m: dict) -> list[str]:
    one = m["runs"][f"--target {m['one']}"]
    out = [f"{HEADING}`doctor` with three targets against one (31B-shape assistant, buggy export, 0.65 GB)", "",
           f"Reproduce: `.venv/bin/python tools/benchmark.py --only multitarget` (rewrites only this section; {m['minutes']:.1f} min). "
           f"Measured {m['started']}, load average at start {m['load_start']}, at end {m['load_end']} (other sessions share the "
           f"2 cores); median of {m['repeats']} alternated whole-process runs, page cache warm.", "",
           f"| command | s (runs) | max RSS MB | vs one target | target <= {TARGET}x |", "|---|---|---|---|---|"]
    for name, v in m["runs"].items():
        ratio = v["s"] / one["s"]
        verdict = "" if v is one else "met" if ratio <= TARGET else "**missed**"
        out.append(f"| `doctor SRC {name}` | {v['s']:.3f} ({', '.join(f'{t:.3f}' for t in v['runs'])}) | {v['rss_mb']:.0f} | "
                   f"{ratio:.2f}x | {verdict} |")
    inside = m["in_process"]
    one_s, three_s = inside[m["one"]], inside[m["three"]]
    return out + ["", f"In one process, without its start (median of {3 * m['repeats']} alternated runs, a fresh Checkpoint each): "
                  f"one target {one_s * 1000:.1f} ms, three {three_s * 1000:.1f} ms ({three_s / one_s:.2f}x). Each target is one "
                  "diagnosis of its own (headers are parsed once per Checkpoint); the process start (imports) dominates a "
                  f"whole `doctor` run, so two more targets add {(three_s - one_s) * 1000:.0f} ms to a {one['s']:.2f} s run.", ""]


def only(out: Path, repeats: int = 11) -> None:
    """Run this case alone and rewrite its section of `out`."""
    import tempfile

    from tools.bench.jobs import splice

    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-mt-", dir="/tmp"))
    try:
        r: dict = {}
        bench_multitarget(work, repeats, r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = out.read_text() if out.exists() else ""
    out.write_text(splice(text, multitarget_section(r["multitarget"]), HEADING))
    print("\n".join(multitarget_section(r["multitarget"])))

