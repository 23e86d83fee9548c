"""A/B: `doctor` on every real-config fixture (tests/data/real), this checkout against another, alternated (#26.4).

    .venv/bin/python -m tools.bench.real_doctor_ab OTHER_CHECKOUT [--repeats 7]

The fixtures are written once with this checkout's tools/real_fixture.py; one contender run is `doctor` (default
target, then `--target vllm==0.32.0`) on each of them in turn, each a fresh `python -m repair` importing that side's
code and its profile data. Prints both medians, every run and the ratio this/other: within the runs' spread = noise.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from tools.bench.measure import PY, REPO, alternate, timed
from tools.real_fixture import REAL_MODELS, write_real_model


def doctors(checkout: Path, folders: list[Path]):
    """Every fixture through doctor twice (default target, vLLM 0.32); exit 1 (findings) is a result, not a failure."""
    runs = " && ".join(f'{{ PYTHONPATH={checkout} {PY} -m repair doctor {f} {t} > /dev/null; [ $? -le 1 ]; }}'
                       for f in folders for t in ("", "--target vllm==0.32.0"))
    return lambda: timed(["bash", "-c", runs], cwd=checkout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path, help="the other checkout (e.g. `git archive main | tar -x -C DIR`)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ckpt-real-ab-") as tmp:
        folders = [write_real_model(Path(tmp) / key, key) for key in REAL_MODELS]
        runs = alternate({"this": doctors(REPO, folders), "other": doctors(args.other.resolve(), folders)}, args.repeats)
    ratio = runs["this"]["s"] / runs["other"]["s"]
    print(f"doctor x {2 * len(folders)} on {len(folders)} real-config fixtures: this {runs['this']['s']:.2f} s "
          f"{runs['this']['runs']}, other {runs['other']['s']:.2f} s {runs['other']['runs']}, this/other {ratio:.3f}x")
    print(json.dumps({"load": os.getloadavg(), "results": runs}))


if __name__ == "__main__":
    main()
