"""`fix --target bf16 --jobs 1` against `--jobs 2` (issue #27.4 and .6), alternated in one run, bytes compared.

    .venv/bin/python tools/benchmark.py --only jobs     # rewrites section 9 of BENCHMARKS.md only

Two layouts: the 4.7 GB multi-shard one (22 modules dequantized in shard 1, 4 GB of filler shards
copied whole) and the 31B assistant alone (0.65 GB, one shard, the same 22 modules), where the
dequantizing is a larger part of the run.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from pathlib import Path

from tools.bench import inputs, measure
from tools.bench.measure import CLI, REPO

HEADING = "## 9. "
TARGET = 0.6  # --jobs 2 at most this fraction of --jobs 1's time


def bench_jobs(work: Path, quick: bool, repeats: int, r: dict) -> None:
    started, load_start = time.time(), measure.load()
    layouts = {"31B assistant, one shard": lambda f: inputs.build_31b(f, vocab=4096 if quick else None),
               f"multi-shard, {1.5 if quick else 4} GB filler": lambda f: inputs.build_multishard(f, 1.5 if quick else 4)}
    cases = {}
    for label, build in layouts.items():
        src = build(work / f"jobs-{len(cases)}")
        runs = measure.alternate({f"--jobs {n}": measure.fix(src, work / f"jobs-out-{n}", "--target", "bf16", "--jobs", str(n))
                                  for n in (1, 2)}, repeats)
        cases[label] = {"gb": inputs.size_bytes(src) / 1e9, "runs": runs, "identical": _identical(src, work)}
        shutil.rmtree(src, ignore_errors=True)
    r["jobs"] = {"cases": cases, "repeats": repeats, "load_start": load_start, "load_end": measure.load(),
                 "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "minutes": (time.time() - started) / 60}


def _identical(src: Path, work: Path) -> bool:
    """One output per --jobs value (1, 2, 3): every file byte-identical."""
    trees = []
    for n in (1, 2, 3):
        out = work / f"jobs-cmp-{n}"
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
           f"2 cores); median of {j['repeats']} alternated runs, page cache warm, dirty pages flushed before each run.", "",
           f"| layout | GB | --jobs 1 s (runs) | --jobs 2 s (runs) | ratio | target <= {TARGET}x | bytes identical for --jobs 1, 2, 3 |",
           "|---|---|---|---|---|---|---|"]
    for label, c in j["cases"].items():
        one, two = c["runs"]["--jobs 1"], c["runs"]["--jobs 2"]
        ratio = two["s"] / one["s"]
        runs = lambda v: f"{v['s']:.2f} ({', '.join(f'{t:.2f}' for t in v['runs'])})"  # noqa: E731
        out.append(f"| {label} | {c['gb']:.2f} | {runs(one)} | {runs(two)} | {ratio:.2f}x | {'met' if ratio <= TARGET else '**missed**'} | "
                   f"{'yes' if c['identical'] else '**no**'} |")
    return out + [""]


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
