"""`fix --tp 2` of a multi-shard layout and `unshard` of its output: this checkout against another, alternated in one
run (wall and CPU of each process, same-run ratios), outputs compared file by file.

    .venv/bin/python -m tools.bench.tpcopies OTHER_CHECKOUT [--repeats 5] [--gb 2] [--nested-gb 1]

The input is inputs.build_multishard (the 31B assistant's shard plus 512 MiB filler shards) with the files a published
repo carries beside its shards, which `fix --tp N` copies whole into every rank folder and `unshard` copies back from
rank 0: a 33 MB tokenizer.json (Gemma's size) and, with --nested-gb, an `original/consolidated.00.pth` of that size (as
Meta's Llama repos ship their consolidated checkpoint beside the safetensors shards). Each side runs `python -m repair` from its own folder with the same
interpreter, from one bytecode cache (measure.as_installed); CPU is user + system of the process and its threads
(/usr/bin/time). Dirty pages are flushed before each run (measure.fresh); the page cache is warm. Prints markdown.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tools.bench import inputs, measure
from tools.bench.measure import PY, REPO
from tools.bench.unshard import contender, timed

TOKENIZER_BYTES = 33_000_000


def with_small_files(src: Path, nested_gb: float) -> Path:
    """The repo's other files: a tokenizer.json and, if asked, a nested original checkpoint (bytes we never parse)."""
    vocab = {f"tok{i:07d}": i for i in range(TOKENIZER_BYTES // 22)}  # ~22 bytes an entry
    (src / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": vocab}}))
    if nested_gb > 0:
        (src / "original").mkdir()
        block = bytes(range(256)) * (1 << 14)  # 4 MiB
        with open(src / "original" / "consolidated.00.pth", "wb") as fh:
            for _ in range(int(nested_gb * 1e9) // len(block)):
                fh.write(block)
    return src


def tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.file_digest(open(p, "rb"), "sha256").hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (its repair/ imported through PYTHONPATH)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gb", type=float, default=2.0, help="size of the shards")
    parser.add_argument("--nested-gb", type=float, default=1.0, help="size of original/consolidated.00.pth (0: none)")
    args = parser.parse_args()
    sides = {"this": REPO, "before": args.other.resolve()}
    measure.as_installed()
    with tempfile.TemporaryDirectory(prefix="ckpt-bench-tpcopies-", dir="/tmp") as tmp:
        work = Path(tmp)
        src = with_small_files(inputs.build_multishard(work / "src", args.gb), args.nested_gb)
        fix = {name: f"PYTHONPATH={side} {PY} -m repair fix {src} --tp 2 --quiet -o" for name, side in sides.items()}
        unshard = {name: f"PYTHONPATH={side} {PY} -m repair unshard {work / 'tp'} -o" for name, side in sides.items()}
        for name, side in sides.items():  # untimed: fills the bytecode cache, and the outputs are compared
            timed(f"{fix[name]} {work / ('tp' if name == 'this' else 'tp-' + name)}", side)
        same_tp = tree(work / "tp") == tree(work / "tp-before")
        subprocess.run(["rm", "-rf", str(work / "tp-before")], check=True)
        for name, side in sides.items():
            timed(f"{unshard[name]} {work / ('std-' + name)}", side)
        same_std = tree(work / "std-this") == tree(work / "std-before")
        subprocess.run(["rm", "-rf", str(work / "std-this"), str(work / "std-before")], check=True)
        cpu: dict[str, list[float]] = {}
        contenders = {}
        for command, lines in (("fix --tp 2", fix), ("unshard", unshard)):
            for name, side in sides.items():
                key = f"{command} ({name})"
                contenders[key] = contender(lambda d, line=lines[name]: f"{line} {d}", work / f"out-{len(contenders)}",
                                            side, cpu.setdefault(key, []))
        load, started = measure.load(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        runs = measure.alternate(contenders, args.repeats)
        sizes = inputs.size_bytes(src) / 1e9, inputs.size_bytes(work / "tp") / 1e9
    print(f"{started}, load {load} -> {measure.load()}, {args.repeats} alternated rounds, {os.cpu_count()} cores; input "
          f"{sizes[0]:.2f} GB (original/ {args.nested_gb:.2f} GB), --tp 2 output {sizes[1]:.2f} GB; outputs identical: "
          f"fix --tp {same_tp}, unshard {same_std}\n")
    print("| contender | wall s (median) | wall runs | CPU s (median) | CPU runs |")
    print("|---|---|---|---|---|")
    for key, run in runs.items():
        print(f"| {key} | {run['s']:.2f} | {', '.join(f'{t:.2f}' for t in run['runs'])} | {statistics.median(cpu[key]):.2f} | "
              f"{', '.join(f'{c:.2f}' for c in cpu[key])} |")
    for command in ("fix --tp 2", "unshard"):
        this, before = f"{command} (this)", f"{command} (before)"
        print(f"\n{command} this / before: {runs[this]['s'] / runs[before]['s']:.2f}x wall, "
              f"{statistics.median(cpu[this]) / statistics.median(cpu[before]):.2f}x CPU")


if __name__ == "__main__":
    main()
