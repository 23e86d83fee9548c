"""`fix --target bf16 --jobs 1` against `--jobs 2` (issue #27.4 and .6), alternated in one run, bytes compared.

    .venv/bin/python tools/benchmark.py --only jobs     # rewrites section 9 of BENCHMARKS.md only

Three layouts: a compute-heavy one (60 NVFP4 modules of 4-16 M weights dequantized, almost nothing
copied: where `--jobs` can pay; its output written to the disk, and to tmpfs, where no disk sets the
pace), the 31B assistant alone (0.65 GB, one shard, 22 modules, 0.5 GB copied) and the 4.7 GB
multi-shard one (the same plus 4 GB of filler shards copied whole). Besides wall times, each `--jobs`
value's CPU per thread (tools/bench/thread_cpu.py) gives the bound two idle cores would show:
start + max(busiest thread's rest, the rest / 2), where start is the main thread's CPU before the first
computed tensor (one core works alone until then). On a machine shared with other sessions the wall
times mostly measure them. The disk floor is `dd conv=fsync` of as many bytes as the output holds:
no durable write of it can be faster here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from tools.bench import inputs, measure
from tools.bench.measure import CLI, PY, REPO

HEADING = "## 9. "
TARGET = 0.6  # --jobs 2 at most this fraction of --jobs 1's time
CORES = 2
HEAVY_LAYERS = 12  # 60 changed modules, 0.45 GB in, 1.36 GB of bf16 out: the start (~0.45 s CPU) is a small part
TMPFS = Path("/dev/shm")


def bench_jobs(work: Path, quick: bool, repeats: int, r: dict) -> None:
    started, load_start = time.time(), measure.load()
    heavy = f"compute-heavy, {5 * (2 if quick else HEAVY_LAYERS)} modules, one shard"
    layouts = {heavy: (lambda f: inputs.build_compute_heavy(f, 2 if quick else HEAVY_LAYERS), (work, TMPFS)),
               "31B assistant, one shard": (lambda f: inputs.build_31b(f, vocab=4096 if quick else None), (work,)),
               f"multi-shard, {1.5 if quick else 4} GB filler": (lambda f: inputs.build_multishard(f, 1.5 if quick else 4), (work,))}
    cases = {}
    for label, (build, places) in layouts.items():
        src = build(work / f"jobs-{len(cases)}")
        for place in places:
            if place == TMPFS and not (TMPFS.is_dir() and shutil.disk_usage(TMPFS).free > 4 * inputs.size_bytes(src) * 4):
                continue  # no tmpfs with room for the outputs
            out = place / f"ckpt-bench-jobs-{os.getpid()}"
            runs = measure.alternate({f"--jobs {n}": measure.fix(src, Path(f"{out}-{n}"), "--target", "bf16", "--jobs", str(n)) for n in (1, 2)},
                                     repeats)
            cpu = {n: _thread_cpu(src, Path(f"{out}-cpu-{n}"), n) for n in (1, 2)}
            written = _output_bytes(src, Path(f"{out}-size"))
            where = "tmpfs" if place == TMPFS else "disk"
            cases[f"{label}, output on {where}"] = {"gb": inputs.size_bytes(src) / 1e9, "out_gb": written / 1e9, "runs": runs, "cpu": cpu,
                                                    "disk_floor": _disk_floor(Path(f"{out}-floor"), written, repeats) if where == "disk" else None,
                                                    "identical": _identical(src, Path(f"{out}-cmp"))}
        shutil.rmtree(src, ignore_errors=True)
    r["jobs"] = {"cases": cases, "repeats": repeats, "load_start": load_start, "load_end": measure.load(),
                 "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "minutes": (time.time() - started) / 60}


def _output_bytes(src: Path, out: Path) -> int:
    shutil.rmtree(out, ignore_errors=True)
    subprocess.run([*CLI, "fix", str(src), "-o", str(out), "--quiet", "--target", "bf16"], check=True, cwd=REPO, capture_output=True)
    size = inputs.size_bytes(out)
    shutil.rmtree(out, ignore_errors=True)
    return size


def _disk_floor(path: Path, size: int, repeats: int) -> float:
    """Median wall s of writing `size` bytes to the disk durably (`dd conv=fsync`), dirty pages flushed before each."""
    def once() -> tuple[float, int]:
        path.unlink(missing_ok=True)
        os.sync()
        try:
            return measure.timed(["dd", "if=/dev/zero", f"of={path}", "bs=16M", f"count={size}", "iflag=count_bytes", "conv=fsync", "status=none"])
        finally:
            path.unlink(missing_ok=True)
    return measure.alternate({"dd": once}, repeats)["dd"]["s"]


def _thread_cpu(src: Path, out: Path, jobs: int) -> dict:
    """Per-thread CPU of one run (the median-total of three), and its two-core bound."""
    got = []
    for _ in range(3):
        shutil.rmtree(out, ignore_errors=True)
        done = subprocess.run([PY, "-m", "tools.bench.thread_cpu", str(src), str(out), "--target", "bf16", "--jobs", str(jobs)],
                              check=True, cwd=REPO, capture_output=True, text=True)
        got.append(json.loads(done.stdout.strip().splitlines()[-1]))
    shutil.rmtree(out, ignore_errors=True)
    one = sorted(got, key=lambda g: g["total"])[1]
    rest = {role: cpu - (one["start"] if role == "main" else 0) for role, cpu in one["threads"].items()}
    busiest = max(one["busiest_thread"] - (one["start"] if one["busiest_thread"] == one["threads"].get("main") else 0), rest.get("main", 0))
    return {**one, "bound": one["start"] + max(busiest, sum(rest.values()) / CORES)}


def _identical(src: Path, base: Path) -> bool:
    """One output per --jobs value (1, 2, 3): every file byte-identical."""
    trees = []
    for n in (1, 2, 3):
        out = Path(f"{base}-{n}")
        shutil.rmtree(out, ignore_errors=True)
        subprocess.run([*CLI, "fix", str(src), "-o", str(out), "--quiet", "--target", "bf16", "--jobs", str(n)], check=True, cwd=REPO, capture_output=True)
        trees.append({p.relative_to(out).as_posix(): _sha256(p) for p in sorted(out.rglob("*")) if p.is_file()})
        shutil.rmtree(out, ignore_errors=True)
    return all(t == trees[0] for t in trees[1:])


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def jobs_section(j: dict) -> list[str]:
    out = [f"{HEADING}`fix --target bf16 --jobs 2` against `--jobs 1`", "",
           f"Reproduce: `.venv/bin/python tools/benchmark.py --only jobs` (rewrites only this section; {j['minutes']:.1f} min). "
           f"Measured {j['started']}, load average at start {j['load_start']}, at end {j['load_end']} (other sessions share the "
           f"2 cores); median of {j['repeats']} alternated runs, page cache warm, dirty pages flushed before each run. "
           "CPU per thread (tools/bench/thread_cpu.py, the middle of 3 runs): start / main / compute workers / sha256 / total s; "
           f"bound = start + max(busiest thread's rest, rest / {CORES}), what two idle cores would take (start: the main thread's CPU "
           "before the first computed tensor). Disk floor: `dd conv=fsync` of as many bytes as the output holds.", "",
           f"| layout | GB in / out | --jobs 1 s (runs) | --jobs 2 s (runs) | wall ratio | disk floor s | CPU --jobs 1 | CPU --jobs 2 | bound ratio | "
           f"target <= {TARGET}x | bytes identical for --jobs 1, 2, 3 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, c in j["cases"].items():
        one, two = c["runs"]["--jobs 1"], c["runs"]["--jobs 2"]
        ratio, bound = two["s"] / one["s"], c["cpu"][2]["bound"] / c["cpu"][1]["bound"]
        runs = lambda v: f"{v['s']:.2f} ({', '.join(f'{t:.2f}' for t in v['runs'])})"  # noqa: E731
        floor = f"{c['disk_floor']:.2f}" if c.get("disk_floor") else "-"
        out.append(f"| {label} | {c['gb']:.2f} / {c.get('out_gb', 0):.2f} | {runs(one)} | {runs(two)} | {ratio:.2f}x | {floor} | {_cpu(c['cpu'][1])} | {_cpu(c['cpu'][2])} | "
                   f"{bound:.2f}x | {'met' if ratio <= TARGET else '**missed**'} | {'yes' if c['identical'] else '**no**'} |")
    return out + [""]


def _cpu(c: dict) -> str:
    t = c["threads"]
    return f"{c.get('start', 0):.2f} / {t.get('main', 0):.2f} / {t.get('compute', 0):.2f} / {t.get('sha256', 0):.2f} / {c['total']:.2f} (bound {c['bound']:.2f})"


def splice(text: str, section: list[str], heading: str = HEADING) -> str:
    """BENCHMARKS.md with section `heading` (9) replaced (or added before the Findings), everything else as it was."""
    body, findings = (text.split("\n## Findings", 1) + [""])[:2]
    if heading in body:
        start = body.index(heading)
        rest = body[start + len(heading):]
        end = rest.find("\n## ")
        body = body[:start] + (rest[end + 1:] if end >= 0 else "")
    findings = "\n## Findings" + findings if findings else ""
    return body.rstrip("\n") + "\n\n" + "\n".join(section) + findings
