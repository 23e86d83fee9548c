"""`python -m tools.malformed [DIR]`: write every case into DIR/<case> to look at by hand."""

from __future__ import annotations

import sys
from pathlib import Path

from . import CASES, build

if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "malformed-corpus")
    for name in CASES:
        built = build(name, root / name)
        print(f"{name:32} {built.src}  expect: {built.expect}")
