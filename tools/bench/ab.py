"""A/B: this checkout's CLI against another checkout's (e.g. before a refactor), in alternation, in one run.

    .venv/bin/python -m tools.bench.ab OTHER_CHECKOUT [--repeats 5] [--gb 2.2]

Both sides run `python -m repair` with the same interpreter, each from its own folder (so each imports its own
code); inputs are built once with this checkout's generator. Prints, per case, both medians, every run and the
ratio this/other: a ratio within the spread of the runs is noise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from pathlib import Path

from tools.bench import inputs
from tools.bench.measure import PY, REPO, alternate, fresh, timed


def cli(checkout: Path, *args: str):
    """One run of the CLI from `checkout`, importing that checkout's code."""
    return lambda: timed(["env", f"PYTHONPATH={checkout}", PY, "-m", "repair", *args], cwd=checkout)


def writer(checkout: Path, src: Path, dst: Path, *flags: str):
    return fresh(dst, lambda d: cli(checkout, "fix", str(src), "-o", str(d), "--quiet", *flags)())


def doctor(checkout: Path, src: Path):
    """doctor exits 1 on this input (it has the handshake bug), which `timed` would call a failure."""
    return lambda: timed(["bash", "-c", f'PYTHONPATH={checkout} {PY} -m repair doctor {src} > /dev/null; [ $? -le 1 ]'], cwd=checkout)


def cases(work: Path, gb: float) -> dict[str, tuple[Path, callable]]:
    a31b = inputs.build_31b(work / "a31b")
    multi = inputs.build_multishard(work / "multi", gb)
    s64 = inputs.build_64_shards(work / "s64")
    return {
        "fix, 31B shapes": lambda side: writer(side, a31b, work / "out"),
        "fix --target bf16, 31B shapes": lambda side: writer(side, a31b, work / "out", "--target", "bf16"),
        f"fix, {inputs.size_bytes(multi) / 1e9:.1f} GB multi-shard": lambda side: writer(side, multi, work / "out"),
        "inspect, 64 shards": lambda side: cli(side, "inspect", str(s64)),
        "doctor, 64 shards": lambda side: doctor(side, s64),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (a git worktree)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gb", type=float, default=2.2)
    args = parser.parse_args()
    sides = {"this": REPO, "other": args.other.resolve()}
    results = {}
    with tempfile.TemporaryDirectory(prefix="ckpt-ab-") as tmp:
        for case, make in cases(Path(tmp), args.gb).items():
            runs = alternate({name: make(path) for name, path in sides.items()}, args.repeats)
            results[case] = runs
            ratio = runs["this"]["s"] / runs["other"]["s"]
            print(f"{case}: this {runs['this']['s']:.2f} s {runs['this']['runs']}, other {runs['other']['s']:.2f} s "
                  f"{runs['other']['runs']}, this/other {ratio:.2f}x", flush=True)
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"load": os.getloadavg(), "results": results}))


if __name__ == "__main__":
    main()
