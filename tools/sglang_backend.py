"""The `transformers_backend` block of repair/targets/data/sglang-<release>.json, asked of SGLang's own gate.

    python -m tools.sglang_backend [SGLANG_VENV]   (default /work/venvs/sglang-0.5.23; rewrites the data file)

With no listed architecture in its registry, SGLang 0.5.23 (model_impl="auto") asks every listed name of its
Transformers backend (model_loader/utils.py:108-191 `resolve_transformers_arch`): a name transformers lacks is refused
("Cannot find model module"), one whose class is not backend-compatible is refused ("has no SGlang implementation and
the Transformers implementation is not compatible with SGLang"), and only when every name passes does it build the
backend's class. tools/sglang_registry.py runs that function in SGLang's venv on every top-level name of the
transformers installed there (see its docstring); repair/arch/registry.py reads the block.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tools.sglang_built_layers import ROOT, write_generated


def generate(venv) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SGLANG_USE_CPU_ENGINE")}
    proc = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "sglang_registry.py")], capture_output=True,
                          text=True, timeout=1800, env=env | {"HF_HUB_OFFLINE": "1"}, cwd="/", check=True)
    return json.loads(proc.stdout.splitlines()[0])["transformers_backend"]


def main(argv: list[str]) -> int:
    return write_generated(argv, "transformers_backend", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
