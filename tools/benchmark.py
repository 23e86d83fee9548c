"""Benchmarks for ckpt-repair, each against a baseline measured in the same run (not a timed test).

    .venv/bin/python tools/benchmark.py [--quick] [--out BENCHMARKS.md]

Contenders run alternately, repeated; medians and ratios are reported. "floor" is
`python -c "import torch"` followed by `cp -r SRC DST`: what any torch-based tool must pay.
The page cache is warm for every contender (it cannot be dropped reliably here). Peak memory is
/usr/bin/time's max RSS of the measured process. Inputs are built with repair.demo.examples and
deleted right after use (up to ~17 GB of disk at once for the 8 GB cases). --quick is a smoke
check (small sizes, one round, < 2 min). The "## Findings" part of an existing --out file is
kept as written (it is the analysis); everything above it is regenerated.
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.bench import inputs, jobs, measure, multitarget, peers  # noqa: E402
from tools.bench.measure import CLI, PY, REPO, alternate, fresh, timed  # noqa: E402
from tools.bench.report import render  # noqa: E402


def largest_changed_mb(src: Path, *flags: str) -> float:
    """Largest tensor the plan writes in full precision (from `fix --dry-run --json`)."""
    done = subprocess.run([*CLI, "fix", str(src), "-o", str(src.parent / "never-written"), "--dry-run", "--json", *flags],
                          capture_output=True, text=True, cwd=REPO, check=True)
    sizes = [2 * _numel(t["shape"]) for c in json.loads(done.stdout)["plan"]["changes"] for t in c["after"] if t["dtype"] == "BF16"]
    return max(sizes, default=0) / 2**20


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def phases(src: Path, work: Path, *flags: str) -> dict:
    """One in-process run of fix with its phases timed (tools/bench/phases.py)."""
    from tools.bench.phases import torch_import_seconds

    out, result = work / "phases-out", work / "phases.json"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    done = subprocess.run([PY, "-X", "importtime", "-m", "tools.bench.phases", str(src), str(out), str(result), *flags],
                          capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    shutil.rmtree(out, ignore_errors=True)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    data = json.loads(result.read_text())
    data["spent"]["  of which: import torch (- = not imported)"] = torch_import_seconds(done.stderr)
    data["wall (process)"] = wall
    return data


def script(code: str, *args: str):
    return lambda dst: timed([PY, "-c", code, *map(str, args), str(dst)])


def bench_31b(work: Path, quick: bool, repeats: int, r: dict) -> None:
    src = inputs.build_31b(work / "a31b", vocab=4096 if quick else None)
    modules = "pre_projection,post_projection"
    r["31b"] = {"gb": inputs.size_bytes(src) / 1e9, "largest_mb": {"fix": largest_changed_mb(src), "fix --target bf16": largest_changed_mb(src, "--target", "bf16")}}
    contenders = {
        "floor": measure.floor(src, work / "floor"),
        "fix": measure.fix(src, work / "ours"),
        "fix --target bf16": measure.fix(src, work / "ours-bf16", "--target", "bf16"),
        "naive load_file + save_file": fresh(work / "naive", lambda d: timed([PY, "-c", peers.NAIVE, str(src), str(d), modules])),
        "compressed-tensors convert_checkpoint": fresh(work / "ct", lambda d: timed([PY, "-c", peers.COMPRESSED_TENSORS, str(src), str(d)])),
    }
    r["31b"]["runs"] = alternate(contenders, repeats)
    r["31b"]["phases"] = {"fix": phases(src, work), "fix --target bf16": phases(src, work, "--target", "bf16")}
    # outputs, kept once for comparison
    ours, bf16, naive, ct = work / "cmp-ours", work / "cmp-bf16", work / "cmp-naive", work / "cmp-ct"
    quiet = dict(check=True, cwd=REPO, capture_output=True)
    subprocess.run([*CLI, "fix", str(src), "-o", str(ours), "--quiet"], **quiet)
    subprocess.run([*CLI, "fix", str(src), "-o", str(bf16), "--quiet", "--target", "bf16"], **quiet)
    subprocess.run([PY, "-c", peers.NAIVE, str(src), str(naive), modules], **quiet)
    subprocess.run([PY, "-c", peers.COMPRESSED_TENSORS, str(src), str(ct)], check=True, cwd=REPO, capture_output=True)
    r["31b"]["compare"] = {"naive vs fix": peers.compare(ours, naive), "compressed-tensors vs fix --target bf16": peers.compare(bf16, ct)}
    for folder in (src, ours, bf16, naive, ct):
        shutil.rmtree(folder, ignore_errors=True)


def bench_growth(work: Path, quick: bool, repeats: int, r: dict) -> None:
    sizes = [1.5] if quick else [1, 4, 8]
    for layout, build in (("multi-shard", inputs.build_multishard), ("one shard", inputs.build_one_shard)):
        r[layout] = {}
        for gb in sizes:
            src = build(work / f"{layout.replace(' ', '')}-{gb}", gb)
            reps = repeats if (gb == 4 and layout == "multi-shard") or quick else 1
            res = alternate({"floor": measure.floor(src, work / "floor"), "fix": measure.fix(src, work / "ours")}, reps)
            entry = {"gb": inputs.size_bytes(src) / 1e9, "runs": res}
            if layout == "multi-shard" and gb == (4 if not quick else sizes[0]):
                entry["phases"] = phases(src, work)
            r[layout][gb] = entry
            shutil.rmtree(src, ignore_errors=True)
    r["growth_largest_mb"] = r["31b"]["largest_mb"]["fix"]


def bench_inspect(work: Path, repeats: int, r: dict) -> None:
    src = inputs.build_64_shards(work / "s64")
    shards = len(list(src.glob("*.safetensors")))
    runs = alternate({"python -c \"import json\"": lambda: timed([PY, "-c", "import json"]),
                      "ckpt-repair inspect": lambda: timed([*CLI, "inspect", str(src)]),
                      "ckpt-repair doctor": lambda: _doctor(src)}, repeats)
    r["inspect"] = {"shards": shards, "runs": runs}
    shutil.rmtree(src, ignore_errors=True)


def _doctor(src: Path) -> tuple[float, int]:
    """doctor exits 1 when it finds problems (this input has the packed-handshake bug): that is not a failure."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", *CLI, "doctor", str(src)], capture_output=True, text=True, cwd=REPO)
    if done.returncode not in (0, 1):
        raise RuntimeError(done.stderr[-2000:])
    return time.perf_counter() - start, int(done.stderr.strip().splitlines()[-1])


MANY_TENSORS_RECIPE = """name = "bench-a-few-experts"
[[rules]]
action = "dequantize"
modules = ["model.layers.3.mlp.experts.0.*", "re:model\\\\.layers\\\\.60\\\\.mlp\\\\.shared_experts\\\\..*"]
"""


def bench_many_tensors(work: Path, repeats: int, r: dict) -> None:
    """inspect, doctor and fix --dry-run on the DeepSeek-R1-sized header-only checkpoint (section 7)."""
    from tools.bench import many_tensors

    started = time.time()
    src = many_tensors.write(work / "deepseek-r1-layout")
    recipe = work / "a-few-experts.toml"
    recipe.write_text(MANY_TENSORS_RECIPE)
    runs = alternate({"inspect": lambda: timed([*CLI, "inspect", str(src)]), "doctor": lambda: _doctor(src),
                      "fix --dry-run": lambda: timed([*CLI, "fix", str(src), "-o", str(work / "never"), "--dry-run", "--recipe", str(recipe)])}, repeats)
    shards = list(src.glob("*.safetensors"))
    block_scales = sum(1 for _, dtype, _ in many_tensors.tensors(58, 256) if dtype == "F8_E4M3")
    r["many_tensors"] = {
        "tensors": len(many_tensors.tensors(58, 256)), "shards": len(shards), "layers": 58, "experts": 256, "runs": runs,
        "expert_shape": [many_tensors.EXPERT_OUT, many_tensors.EXPERT_IN], "repeats": repeats,
        "scale_mb": block_scales * many_tensors.EXPERT_OUT * many_tensors.EXPERT_IN // 16 / 2**20,
        "recipe": "a recipe dequantizing 6 modules (`model.layers.3.mlp.experts.0.*` and a `re:` pattern on layer 60's shared experts)",
        "command": ".venv/bin/python tools/benchmark.py --only many-tensors", "load_start": r.get("load_start", measure.load()),
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "minutes": (time.time() - started) / 60,
    }
    r["many_tensors"]["load_end"] = measure.load()
    shutil.rmtree(src, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes, one round: a smoke check (< 2 min)")
    parser.add_argument("--out", type=Path, default=None, help="default: BENCHMARKS.md (--quick: /tmp/BENCHMARKS.quick.md)")
    parser.add_argument("--render", type=Path, metavar="JSON", help="only rewrite --out from a run's saved figures (/tmp/ckpt-bench-last.json)")
    parser.add_argument("--only", choices=["many-tensors", "sparse-r1", "deep", "jobs", "web", "multitarget"], help="run one case and rewrite only its "
                        "section of --out (web: with .venv-web's python, `make test-web` builds it)")
    args = parser.parse_args()
    if not args.render:
        measure.as_installed()  # every timed Python runs from bytecode, as an installed package does
    if args.only in ("sparse-r1", "deep"):
        return only_sparse_r1(args.out or REPO / "BENCHMARKS.md", 3 if args.only == "sparse-r1" else 5, args.only)
    if args.only == "jobs":
        return only_jobs(args.out or REPO / "BENCHMARKS.md", args.quick)
    if args.only == "multitarget":
        return multitarget.only(args.out or REPO / "BENCHMARKS.md", 3 if args.quick else 11)
    if args.only == "web":
        from tools.bench import web

        return web.main(args.out or REPO / "BENCHMARKS.md")
    if args.only:
        return only_many_tensors(args.out or REPO / "BENCHMARKS.md")
    args.out = args.out or (Path(tempfile.gettempdir()) / "BENCHMARKS.quick.md" if args.quick else REPO / "BENCHMARKS.md")
    if args.render:
        return write(args.out, json.loads(args.render.read_text()))
    import torch
    from tools.bench.codec import codec_bench

    repeats = 1 if args.quick else 5
    started = time.time()
    r: dict = {"quick": args.quick, "repeats": repeats, "load_start": measure.load(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="/tmp"))
    try:
        r["torch_rss_mb"] = measure.torch_import_rss_mb()
        bench_31b(work, args.quick, repeats, r)
        bench_growth(work, args.quick, repeats, r)
        r["codec"] = codec_bench(2048 if args.quick else 8192, 1 if args.quick else 5)
        bench_inspect(work, 3 if args.quick else 11, r)
        bench_many_tensors(work, 1 if args.quick else 3, r)
        jobs.bench_jobs(work, args.quick, 1 if args.quick else 5, r)
        multitarget.bench_multitarget(work, 3 if args.quick else 11, r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    r["load_end"], r["minutes"] = measure.load(), (time.time() - started) / 60
    (Path(tempfile.gettempdir()) / "ckpt-bench-last.json").write_text(json.dumps(r, indent=1, default=str))  # raw figures
    write(args.out, r)


def only_many_tensors(out: Path) -> None:
    from tools.bench.report import many_tensors_section, splice_many_tensors

    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="/tmp"))
    r: dict = {"load_start": measure.load()}
    try:
        bench_many_tensors(work, 3, r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    section = many_tensors_section(r["many_tensors"])
    out.write_text(splice_many_tensors(out.read_text() if out.exists() else "# Benchmarks\n", section))
    print("\n".join(section))


def only_sparse_r1(out: Path, repeats: int = 3, part: str = "sparse-r1") -> None:
    """#27.6: the sparse DeepSeek-R1 (412 GB apparent, ~0.4 GB on disk) local and through the Hub server (section 8 of
    --out), or (part "deep") --deep on a slice with real block scales against `dd` of them (9.4 GB on disk; section
    8.1). Everything is removed afterwards."""
    from tools.bench import sparse_r1_bench, sparse_r1_report

    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-r1-", dir="/tmp"))
    started = time.time()
    m: dict = {"load_start": measure.load(), "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)), "repeats": repeats,
               "command": f".venv/bin/python tools/benchmark.py --only {part}"}
    saved = Path(tempfile.gettempdir()) / f"ckpt-bench-{part}.json"  # the raw figures
    try:
        if part == "deep":
            m["deep"] = sparse_r1_bench.deep(work, repeats)
        else:
            m["runs"] = sparse_r1_bench.local_and_hub(work, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    m["load_end"], m["minutes"] = measure.load(), (time.time() - started) / 60
    saved.write_text(json.dumps(m, indent=1, default=str))
    lines = sparse_r1_report.deep_section(m) if part == "deep" else sparse_r1_report.section(m)
    heading = sparse_r1_report.DEEP_HEADING if part == "deep" else sparse_r1_report.HEADING
    out.write_text(sparse_r1_report.splice(out.read_text() if out.exists() else "# Benchmarks\n", lines, heading))
    print("\n".join(lines))


def only_jobs(out: Path, quick: bool) -> None:
    """Section 9 alone: fix --target bf16 with --jobs 1 and 2 (tools/bench/jobs.py)."""
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="/tmp"))
    r: dict = {}
    try:
        jobs.bench_jobs(work, quick, 1 if quick else 5, r)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    section = jobs.jobs_section(r["jobs"])
    out.write_text(jobs.splice(out.read_text() if out.exists() else "# Benchmarks\n", section))
    print("\n".join(section))


def write(out: Path, r: dict) -> None:
    """The figures, then the hand-written "## Findings" kept from an existing file."""
    findings = ""
    if out.exists() and "\n## Findings" in out.read_text():
        findings = "\n## Findings" + out.read_text().split("\n## Findings", 1)[1]
    out.write_text(render(r) + findings)
    print(out.read_text())


if __name__ == "__main__":
    main()
