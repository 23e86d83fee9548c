"""#27.6's DeepSeek-R1-sized cases: inspect and doctor of the sparse R1 (tools/bench/sparse_r1.py), from its folder
and through the local Hub server with 30 ms added per request and CDN redirects (tools/bench/hub_latency.py), and
`doctor --deep` against `dd` of exactly the block-scale bytes (a cat of those bytes) on a slice of R1 whose block
scales are all real bytes. Each run reports wall time, bytes read (the kernel's rchar of the process: every byte
its read calls returned, sockets included), peak RSS, and for the Hub the requests and file bytes served and the
peak disk use of its temp folder. Everything is written under `work` and removed by the caller.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
from pathlib import Path

from repair.io.safetensors import read_header
from tools.bench import sparse_r1
from tools.bench.hub_latency import SlowHub, add_sparse_repo, served
from tools.bench.measure import PY, REPO

WRAP = "import atexit, sys, runpy\nout = sys.argv.pop(1)\natexit.register(lambda: open(out, 'w').write(open('/proc/self/io').read()))\n" \
       "sys.argv[0] = 'ckpt-repair'\nrunpy.run_module('repair', run_name='__main__', alter_sys=True)\n"
THREE = "vllm==0.32.0,sglang==0.5.23,trtllm==1.1"  # --deep with several targets reads the block scales once
SLICE_LAYERS = 16  # the deep slice: R1's first 16 layers (3 dense, 13 MoE): 9.4 GB of block scales, all real bytes (8: 3.7 GB,
# where doctor's fixed cost, ~0.6 s CPU of imports and headers, is as long as `cat` of the bytes from the page cache)


def run(args: list, work: Path, env: dict | None = None) -> dict:
    """One CLI run: wall s, rchar bytes, max RSS MB, peak disk use of its TMPDIR (MB), exit code."""
    tmp = work / "tmpdir"
    tmp.mkdir(exist_ok=True)
    io = work / "io.txt"
    peak = [0]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], sum(p.stat().st_blocks * 512 for p in tmp.rglob("*") if p.is_file()))
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", PY, "-c", WRAP, str(io), *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "TMPDIR": str(tmp), **(env or {})})
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    if proc.returncode not in (0, 1, 0x100):
        raise RuntimeError(f"{args} failed ({proc.returncode}): {proc.stderr[-3000:]}")
    counters = dict(line.split(": ") for line in io.read_text().splitlines())
    rss, user, system = proc.stderr.strip().splitlines()[-1].split()
    return {"s": wall, "cpu_s": float(user) + float(system), "read_mb": int(counters["rchar"]) / 1e6, "rss_mb": int(rss) / 1024,
            "tmp_mb": peak[0] / 1e6, "exit": proc.returncode, "stdout": proc.stdout}


def run_shell(script: Path) -> dict:
    """A shell script's wall s and CPU s (user + system, /usr/bin/time), in run()'s form."""
    start = time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-f", "%M %U %S", "bash", str(script)], capture_output=True, text=True, check=True)
    wall = time.perf_counter() - start
    rss, user, system = proc.stderr.strip().splitlines()[-1].split()
    return {"s": wall, "cpu_s": float(user) + float(system), "read_mb": 0.0, "rss_mb": int(rss) / 1024, "tmp_mb": 0.0}


def drop_pages(folder: Path) -> None:
    """Drop the page cache of every file in `folder` (clean pages: written back first), so the next read is the disk's."""
    for path in folder.iterdir():
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def medians(runs: list[dict]) -> dict:
    out = {k: statistics.median(r[k] for r in runs) for k in ("s", "cpu_s", "read_mb", "rss_mb", "tmp_mb")}
    out["runs"] = [round(r["s"], 2) for r in runs]
    out["rss_mb"] = max(r["rss_mb"] for r in runs)
    out["tmp_mb"] = max(r["tmp_mb"] for r in runs)
    return out


def local_and_hub(work: Path, repeats: int) -> dict:
    src = sparse_r1.write(work / "r1", blocks="sample")
    sizes = {p.name: p.stat().st_size for p in src.iterdir()}
    out: dict = {"shards": len([n for n in sizes if n.endswith(".safetensors")]), "apparent_gb": sum(sizes.values()) / 1e9,
                 "on_disk_mb": sum(p.stat().st_blocks * 512 for p in src.iterdir()) / 1e6}
    for name, args in (("inspect", ["inspect", src]), ("doctor", ["doctor", src])):
        out[f"{name} (local)"] = medians([run(args, work) for _ in range(repeats)])
    with SlowHub(work / "hub") as hub:
        add_sparse_repo(hub, "bench/deepseek-r1-sparse", src)
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(work / "hf-home"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        for name in ("inspect", "doctor"):
            runs = []
            for _ in range(repeats):
                hub.clear_log()
                runs.append({**run([name, "bench/deepseek-r1-sparse"], work, env), **served(hub, sizes)})
            out[f"{name} (Hub, 30 ms)"] = {**medians(runs), **{k: runs[-1][k] for k in ("requests", "shard_requests", "other_requests", "bytes")}}
        out["doctor line"] = next((line for line in runs[-1]["stdout"].splitlines() if line.startswith("block scales")), "")
    return out


def deep(work: Path, repeats: int) -> dict:
    """`doctor --deep` against `dd` of the same block-scale bytes, warm (page cache) and cold (the slice's pages dropped
    before each run: R1's 41.6 GB of block scales cannot stay in a 24 GiB page cache, so a `cat` of them reads the
    disk), with plain `doctor` (its fixed cost: imports, headers, the other checks) alternated beside them."""
    src = sparse_r1.write(work / "slice", layers=SLICE_LAYERS, shards=-(-163 * SLICE_LAYERS // 61), blocks="all")
    regions = []
    for shard in sorted(src.glob("*.safetensors")):
        spans = [(t.start, t.end) for t in read_header(shard).tensors if t.dtype == "F8_E4M3"]  # one run, as the writer lays it out
        if spans:
            regions.append((shard, min(s for s, _ in spans), max(e for _, e in spans) - min(s for s, _ in spans)))
    script = "\n".join(f"dd if={p} iflag=skip_bytes,count_bytes skip={s} count={n} bs=4M status=none > /dev/null" for p, s, n in regions)
    (work / "cat.sh").write_text(script)
    total = sum(n for _, _, n in regions)
    os.sync()  # written back, so that dropping the pages drops them all
    contenders = {"dd": lambda: run_shell(work / "cat.sh"), "doctor --deep": lambda: run(["doctor", src, "--deep"], work),
                  "doctor": lambda: run(["doctor", src], work),
                  f"doctor --deep --target {THREE}": lambda: run(["doctor", src, "--deep", "--target", THREE], work)}
    out = {"block_scale_gb": total / 1e9, "shards": len(regions), "layers": SLICE_LAYERS}
    for cache in ("warm", "cold"):
        runs: dict[str, list] = {name: [] for name in contenders}
        for name in contenders if cache == "warm" else ():
            contenders[name]()  # warms the page cache (and Python's)
        for round_ in range(repeats):
            names = list(contenders)[round_ % len(contenders):] + list(contenders)[:round_ % len(contenders)]
            for name in names:
                if cache == "cold":
                    drop_pages(src)
                runs[name].append(contenders[name]())
        out[cache] = {name: medians(v) for name, v in runs.items()}
    with SlowHub(work / "hub-slice") as hub:
        add_sparse_repo(hub, "bench/r1-slice", src)
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(work / "hf-home"), "HF_HUB_DISABLE_XET": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
        hub.clear_log()
        r = run(["doctor", "bench/r1-slice", "--deep", "--json"], work, env)
        checks = json.loads(r["stdout"])["scale_checks"]
        out["doctor --deep (Hub, 30 ms)"] = {**medians([r]), **served(hub, {p.name: p.stat().st_size for p in src.iterdir()}),
                                             "reported_requests": checks["requests"], "reported_bytes": checks["bytes_read"]}
    return out
