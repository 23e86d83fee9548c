"""Timing and peak memory of commands, run in alternation so load drift hits every contender alike."""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
CLI = [PY, "-m", "repair"]


def as_installed() -> Path:
    """Every Python the benchmark starts from now on runs from compiled bytecode, as an installed package does
    (pip compiles a wheel's modules at install; a plain `pip install -e .` writes them on first import).

    This machine sets PYTHONDONTWRITEBYTECODE=1, so without this every timed run of ours compiled every module it
    imported: ~0.1 s of CPU per `fix` (BENCHMARKS, #27.3 fifth pass) that no user pays. The cache lives outside the
    checkouts (PYTHONPYCACHEPREFIX), is filled by untimed runs here, and is shared by every contender (torch's
    import in the floor too), so each pays the same: none compiles while timed. It is a fresh private folder (0700)
    removed when the benchmark ends: a shared, guessable one in /tmp would let anyone plant bytecode we then run."""
    cache = Path(tempfile.mkdtemp(prefix="ckpt-bench-pycache-"))
    atexit.register(shutil.rmtree, cache, True)
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = str(cache)
    from repair.demo.examples import TINY, write_assistant

    with tempfile.TemporaryDirectory(prefix="ckpt-bench-warm-") as tmp:
        src = write_assistant(Path(tmp) / "tiny", TINY)
        for args in (["fix", str(src), "-o", f"{tmp}/a", "--quiet"], ["fix", str(src), "-o", f"{tmp}/b", "--quiet", "--target", "bf16"],
                     ["doctor", str(src), "--target", "vllm==0.32.0"], ["inspect", str(src)]):
            subprocess.run([*CLI, *args], capture_output=True, cwd=REPO)
    subprocess.run([PY, "-c", "import torch, safetensors.torch, numpy"], capture_output=True)
    return cache


def timed(cmd: list[str] | str, shell: bool = False, cwd: Path = REPO) -> tuple[float, int]:
    """Wall seconds and max RSS (KiB, /usr/bin/time %M) of one command; raises with its stderr on failure."""
    full = ["/usr/bin/time", "-f", "%M", "bash", "-c", cmd] if shell else ["/usr/bin/time", "-f", "%M", *cmd]
    start = time.perf_counter()
    done = subprocess.run(full, capture_output=True, text=True, cwd=cwd)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{cmd} failed ({done.returncode}): {done.stderr[-3000:]}")
    return elapsed, int(done.stderr.strip().splitlines()[-1])


def alternate(contenders: dict[str, Callable[[], tuple[float, int]]], repeats: int) -> dict[str, dict]:
    """Each contender once per round, round after round (the order rotates); median time, max RSS."""
    runs: dict[str, list[tuple[float, int]]] = {k: [] for k in contenders}
    names = list(contenders)
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[: round_ % len(names)]:
            runs[name].append(contenders[name]())
    return {k: {"s": statistics.median(t for t, _ in v), "runs": [round(t, 3) for t, _ in v],
                "rss_mb": max(r for _, r in v) / 1024} for k, v in runs.items()}


def fresh(dst: Path, run: Callable[[Path], tuple[float, int]]) -> Callable[[], tuple[float, int]]:
    """A contender that writes to `dst`: removed before and after, and dirty pages flushed (untimed)
    before it starts, so no run pays for the writeback of the one before."""
    def once() -> tuple[float, int]:
        shutil.rmtree(dst, ignore_errors=True)
        os.sync()
        try:
            return run(dst)
        finally:
            shutil.rmtree(dst, ignore_errors=True)
    return once


def floor(src: Path, dst: Path):
    """What any torch-based tool must pay: start Python and import torch, then copy the folder."""
    return fresh(dst, lambda d: timed(f'{PY} -c "import torch" && cp -r {src} {d}', shell=True))


def fix(src: Path, dst: Path, *flags: str):
    return fresh(dst, lambda d: timed([*CLI, "fix", str(src), "-o", str(d), "--quiet", *flags]))


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def torch_import_rss_mb(repeats: int = 3) -> float:
    return max(timed([PY, "-c", "import torch"])[1] for _ in range(repeats)) / 1024
