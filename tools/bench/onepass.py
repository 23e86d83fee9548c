"""`fix` against `cp -r` + `sync` and against another checkout (#27's fix targets, #25's 5%), in one run.

    .venv/bin/python -m tools.bench.onepass OTHER_CHECKOUT [--repeats 5] [--gb 4.7] [--only 31b|multi]

Contenders alternate round by round (order rotating), each writing a fresh folder after an untimed
`sync`: the floor `cp -r SRC DST && sync DST/* DST` (the copy made durable, as `fix` makes its output),
the same with the sha256 of every output file, and of every input and output file (two processes at
once: the report records both), bare `cp -r`, this checkout's `fix` and OTHER's `fix` (same
interpreter, each importing its own code, compiled once beforehand into a bytecode cache outside both
checkouts (measure.as_installed): an installed package has its .pyc files, and a run that compiles every
module, as this machine's PYTHONDONTWRITEBYTECODE=1 makes it, pays ~0.1 s of CPU no user pays).
Wall and CPU (user + system of the process and its children, from wait4) are medians. The last run
of each `fix` is kept and compared file by file: every tensor and config file must be byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from tools.bench import inputs
from tools.bench.measure import PY, REPO, as_installed


def run(cmd: str, cwd: Path = REPO) -> tuple[float, float]:
    """Wall and CPU seconds of one shell command (its children included)."""
    start = time.perf_counter()
    proc = subprocess.Popen(["bash", "-c", cmd], cwd=cwd, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace")
    proc.stderr.close()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"{cmd} failed: {err[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime


def contenders(src: Path, work: Path, other: Path) -> dict[str, tuple[str, Path, str]]:
    """name -> (command, cwd, output folder): `python -m` imports from its cwd first, so each fix runs in its checkout."""
    cp = work / "cp"

    def fix(side: Path, name: str):
        return f"env PYTHONPATH={side} {PY} -m repair fix {src} -o {work / name} --quiet", side, name
    sha = "openssl dgst -sha256 -r"  # OpenSSL's SHA-256 (SHA-NI here), as hashlib's; coreutils' sha256sum is ~4x slower
    return {
        "cp -r + sync": (f"cp -r {src} {cp} && sync {cp}/* {cp}", REPO, "cp"),
        "cp -r + sha256 out + sync": (f"cp -r {src} {cp} && {sha} {cp}/* > /dev/null && sync {cp}/* {cp}", REPO, "cp"),
        "cp -r + sha256 in & out + sync": (f"cp -r {src} {cp} && ({sha} {src}/* > /dev/null & {sha} {cp}/* > /dev/null; wait) && sync {cp}/* {cp}", REPO, "cp"),
        "bare cp -r": (f"cp -r {src} {cp}", REPO, "cp"),
        "fix (this)": fix(REPO, "this"),
        "fix (other)": fix(other, "other"),
    }


def measure(src: Path, work: Path, other: Path, repeats: int) -> dict[str, dict]:
    cmds = contenders(src, work, other)
    names = list(cmds)
    runs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
    for name in ("fix (this)", "fix (other)"):  # untimed: fills the bytecode cache
        cmd, cwd, folder = cmds[name]
        run(cmd, cwd)
        shutil.rmtree(work / folder, ignore_errors=True)
    for round_ in range(repeats):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            cmd, cwd, folder = cmds[name]
            shutil.rmtree(work / folder, ignore_errors=True)
            os.sync()  # untimed: no run pays for the one before
            runs[name].append(run(cmd, cwd))
    return {n: {"wall": statistics.median(w for w, _ in v), "cpu": statistics.median(c for _, c in v),
                "walls": [round(w, 2) for w, _ in v], "cpus": [round(c, 2) for _, c in v]} for n, v in runs.items()}


def identical(a: Path, b: Path) -> list[str]:
    """Files (the report aside) whose bytes differ between two outputs, or that only one has."""
    def digests(folder: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir() if p.name != "repair_report.json"}
    da, db = digests(a), digests(b)
    return sorted(n for n in da.keys() | db.keys() if da.get(n) != db.get(n))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--gb", type=float, default=4.7)
    parser.add_argument("--only", choices=("31b", "multi"))
    args = parser.parse_args()
    as_installed()  # both checkouts run from a bytecode cache, as installed (their modules are compiled by the untimed runs)
    results = {"load_start": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="ckpt-onepass-") as tmp:
        work = Path(tmp)
        cases = {"31b": lambda: inputs.build_31b(work / "a31b"), "multi": lambda: inputs.build_multishard(work / "multi", args.gb)}
        for case, build in cases.items():
            if args.only and case != args.only:
                continue
            src = build()
            got = measure(src, work, args.other.resolve(), args.repeats)
            floor, this, other = got["cp -r + sync"], got["fix (this)"], got["fix (other)"]
            hashed = got["cp -r + sha256 in & out + sync"]
            got["ratios"] = {"wall / floor": this["wall"] / floor["wall"], "cpu / floor": this["cpu"] / floor["cpu"],
                             "wall / hashing floor": this["wall"] / hashed["wall"], "cpu / hashing floor": this["cpu"] / hashed["cpu"],
                             "wall this / other": this["wall"] / other["wall"], "cpu this / other": this["cpu"] / other["cpu"],
                             "wall / bare cp": this["wall"] / got["bare cp -r"]["wall"]}
            got["size_gb"] = inputs.size_bytes(src) / 1e9
            got["differing_files"] = identical(work / "this", work / "other")
            results[case] = got
            print(case, json.dumps(got, indent=1), flush=True)
            shutil.rmtree(src, ignore_errors=True)
            for leftover in ("this", "other", "cp"):
                shutil.rmtree(work / leftover, ignore_errors=True)
    results["load_end"] = os.getloadavg()
    print(json.dumps(results))


if __name__ == "__main__":
    main()
