"""Benchmarks for ckpt-repair, each against a baseline measured in the same run (not a timed test).

    .venv/bin/python tools/benchmark.py [--quick] [--out BENCHMARKS.md]

Pairs run alternately, repeated, and medians are reported with ratios. "floor" is
`python -c "import torch"` followed by `cp -r SRC DST`: what any torch-based tool must pay.
Page cache is warm for both sides (it cannot be dropped reliably here). Peak memory is
/usr/bin/time's max RSS of the measured process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable
CLI = [PY, "-m", "repair"]


def timed(cmd: list[str] | str, shell: bool = False) -> tuple[float, int]:
    """Wall seconds and max RSS (KiB) of one command."""
    full = ["/usr/bin/time", "-f", "%M", "bash", "-c", cmd] if shell else ["/usr/bin/time", "-f", "%M", *cmd]
    start = time.perf_counter()
    done = subprocess.run(full, capture_output=True, text=True, cwd=REPO)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed: {done.stderr[-2000:]}")
    return elapsed, int(done.stderr.strip().splitlines()[-1])


def alternate(pairs: dict[str, callable], repeats: int) -> dict[str, dict]:
    """Run each contender once per round, round after round; medians of time, max of RSS."""
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in pairs}
    for _ in range(repeats):
        for name, run in pairs.items():
            runs[name].append(run())
    return {k: {"s": statistics.median(t for t, _ in v), "rss_mb": max(r for _, r in v) / 1024} for k, v in runs.items()}


def floor(src: Path, work: Path):
    def run():
        dst = work / "floor-copy"
        shutil.rmtree(dst, ignore_errors=True)
        result = timed(f'{PY} -c "import torch" && cp -r {src} {dst}', shell=True)
        shutil.rmtree(dst, ignore_errors=True)
        return result
    return run


def ours(src: Path, work: Path, *flags: str):
    def run():
        dst = work / "ours-out"
        shutil.rmtree(dst, ignore_errors=True)
        result = timed([*CLI, "fix", str(src), "-o", str(dst), "--quiet", *flags])
        shutil.rmtree(dst, ignore_errors=True)
        return result
    return run


NAIVE = """
import sys, torch
from safetensors.torch import load_file, save_file
from repair.codec import nvfp4
src, dst = sys.argv[1], sys.argv[2]
state = load_file(src + "/model.safetensors")
for m in ("pre_projection", "post_projection"):
    state[m + ".weight"] = nvfp4.dequantize(state[m + ".weight"], state.pop(m + ".weight_scale"), state.pop(m + ".weight_scale_2"))
    state.pop(m + ".input_scale", None)
import os; os.makedirs(dst, exist_ok=True)
save_file(state, dst + "/model.safetensors", metadata={"format": "pt"})
"""


def naive(src: Path, work: Path):
    def run():
        dst = work / "naive-out"
        shutil.rmtree(dst, ignore_errors=True)
        result = timed([PY, "-c", NAIVE, str(src), str(dst)])
        shutil.rmtree(dst, ignore_errors=True)
        return result
    return run


def build_31b(folder: Path, vocab: int | None = None) -> Path:
    from repair.examples import GEMMA4_31B, write_assistant

    dims = GEMMA4_31B if vocab is None else dataclasses.replace(GEMMA4_31B, vocab=vocab)
    return write_assistant(folder, dims)


def build_multishard(folder: Path, gigabytes: float) -> Path:
    """The 31B-shape assistant (changed tensors in one shard) plus filler shards to reach the size."""
    import torch
    from safetensors.torch import save_file

    src = build_31b(folder)
    os.replace(src / "model.safetensors", src / "model-00001.safetensors")
    weight_map = {k: "model-00001.safetensors" for k in json.loads(_header(src / "model-00001.safetensors"))}
    weight_map.pop("__metadata__", None)
    filler = max(0, int((gigabytes * 1e9 - (src / "model-00001.safetensors").stat().st_size) / 1e9 + 0.999))
    for i in range(filler):
        name = f"model-{i + 2:05d}.safetensors"
        tensor = torch.full((1 << 29,), i + 1, dtype=torch.bfloat16)  # 1 GiB-ish per shard (content does not matter)
        save_file({f"filler.{i}.weight": tensor}, src / name, metadata={"format": "pt"})
        weight_map[f"filler.{i}.weight"] = name
    index = {"metadata": {"total_size": 0}, "weight_map": dict(sorted(weight_map.items()))}
    (src / "model.safetensors.index.json").write_text(json.dumps(index))
    return src


def _header(path: Path) -> str:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        return fh.read(n).decode()


def size_gb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e9


def codec_bench(quick: bool) -> dict:
    """Our codec vs ModelOpt's NVFP4QTensor on one weight, same outputs asserted."""
    import torch

    from repair.codec import nvfp4
    from tools.modelopt_export import modelopt_dequantize, modelopt_quantize

    n = 2048 if quick else 8192
    weight = (torch.randn(n, n, generator=torch.Generator().manual_seed(0)) * 0.05).bfloat16()
    def best(fn, reps=3):
        times = []
        for _ in range(reps):
            t = time.perf_counter(); out = fn(); times.append(time.perf_counter() - t)
        return statistics.median(times), out
    mq_t, mq = best(lambda: modelopt_quantize(weight))
    oq_t, oq = best(lambda: nvfp4.quantize(weight))
    assert torch.equal(mq[0], oq[0]) and torch.equal(mq[1].view(torch.uint8), oq[1].view(torch.uint8))
    md_t, md = best(lambda: modelopt_dequantize(*oq))
    od_t, od = best(lambda: nvfp4.dequantize(*oq))
    assert torch.equal(md.view(torch.int16), od.view(torch.int16))
    return {"shape": [n, n], "quantize": (oq_t, mq_t), "dequantize": (od_t, md_t), "threads": torch.get_num_threads()}


def inspect_bench(work: Path, repeats: int) -> dict:
    """inspect of a 64-shard checkpoint vs a bare `python -c "import json"`."""
    from safetensors.torch import save_file
    import torch

    from repair.examples import TINY, write_assistant

    src = write_assistant(work / "tiny64", TINY, shards=[["pre_projection"]])
    weight_map = json.loads((src / "model.safetensors.index.json").read_text())["weight_map"]
    for i in range(62):
        name = f"extra-{i:05d}.safetensors"
        save_file({f"extra.{i}.weight": torch.zeros(16, dtype=torch.bfloat16)}, src / name)
        weight_map[f"extra.{i}.weight"] = name
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shards = len(list(src.glob("*.safetensors")))
    res = alternate({"import json": lambda: timed([PY, "-c", "import json"]),
                     "inspect": lambda: timed([*CLI, "inspect", str(src)])}, repeats)
    return {"shards": shards, **res}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat: a smoke check")
    parser.add_argument("--out", type=Path, default=REPO / "BENCHMARKS.md")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    repeats = 1 if args.quick else 3
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir="/tmp"))
    results: dict = {"load": os.getloadavg(), "repeats": repeats}
    try:
        src = build_31b(work / "a31b", vocab=4096 if args.quick else None)
        results["31b_gb"] = size_gb(src)
        results["fix_31b"] = alternate({"floor": floor(src, work), "fix": ours(src, work), "fix --target bf16": ours(src, work, "--target", "bf16"),
                                        "naive load+save": naive(src, work)}, repeats)
        shutil.rmtree(src)
        results["multishard"] = {}
        for gb in ([1.5] if args.quick else [1, 4, 8]):
            big = build_multishard(work / f"m{gb}", gb)
            reps = repeats if gb == 4 or args.quick else 1
            results["multishard"][gb] = {"gb": size_gb(big), **alternate({"floor": floor(big, work), "fix": ours(big, work)}, reps)}
            shutil.rmtree(big)
        results["codec"] = codec_bench(args.quick)
        results["inspect"] = inspect_bench(work, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    args.out.write_text(render(results, args.quick))
    print(args.out.read_text())


def render(r: dict, quick: bool) -> str:
    f = r["fix_31b"]
    lines = [
        "# Benchmarks",
        "",
        f"Reproduce: `.venv/bin/python tools/benchmark.py{' --quick' if quick else ''}` (this file is its output).",
        f"Machine: 2 cores, warm page cache; load average at start {r['load'][0]:.2f}; medians of {r['repeats']} alternating rounds.",
        "floor = `python -c \"import torch\"` + `cp -r SRC DST`.",
        "",
        f"## 1. fix of the 31B-assistant-shape checkpoint ({r['31b_gb']:.2f} GB, one shard)",
        "",
        "| command | seconds | x floor | max RSS MB |",
        "|---|---|---|---|",
    ]
    for name, v in f.items():
        lines.append(f"| {name} | {v['s']:.2f} | {v['s'] / f['floor']['s']:.2f} | {v['rss_mb']:.0f} |")
    lines += ["", "Target: fix <= 1.3x floor. The naive script loads every tensor and saves all of them again.", "",
              "## 2. multi-shard checkpoints, changed tensors in one shard", "",
              "| size GB | floor s | fix s | x floor | floor RSS MB | fix RSS MB |", "|---|---|---|---|---|---|"]
    for v in r["multishard"].values():
        lines.append(f"| {v['gb']:.2f} | {v['floor']['s']:.2f} | {v['fix']['s']:.2f} | {v['fix']['s'] / v['floor']['s']:.2f} | "
                     f"{v['floor']['rss_mb']:.0f} | {v['fix']['rss_mb']:.0f} |")
    c = r["codec"]
    lines += ["", "Target: <= 1.15x floor; RSS flat as the checkpoint grows.", "",
              f"## 3. NVFP4 codec on {c['shape']} vs ModelOpt NVFP4QTensor (CPU, {c['threads']} threads; outputs asserted identical)", "",
              "| op | ours s | ModelOpt s | speed-up |", "|---|---|---|---|"]
    for op in ("dequantize", "quantize"):
        o, m = c[op]
        lines.append(f"| {op} | {o:.3f} | {m:.3f} | {m / o:.2f}x |")
    i = r["inspect"]
    lines += ["", "Target: >= 2x both ways.", "", f"## 6. inspect of a {i['shards']}-shard checkpoint", "",
              "| command | seconds | x `import json` |", "|---|---|---|",
              f"| python -c \"import json\" | {i['import json']['s']:.3f} | 1.00 |",
              f"| ckpt-repair inspect | {i['inspect']['s']:.3f} | {i['inspect']['s'] / i['import json']['s']:.2f} |",
              "", "Target: <= 3x. `inspect` and `doctor` never import torch (tests/test_doctor.py asserts it).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
