#!/usr/bin/env python
"""Which model class SGLang builds for a config's `architectures`, asked of SGLang itself (run in the SGLang venv).

    sglang_registry.py DIR [DIR ...]   one JSON line per folder: the class `get_model_architecture` resolves for its
                                       config.json (SGLang's own ModelConfig), or its error
    sglang_registry.py                 one JSON line: the names its registry imports here (`registered`)

The shipped rules file's `registry` is read from the wheel (tools/sglang_rules_data.py: every EntryClass); here the
installed registry is what imports on this host (a model file whose GPU-only dependency is missing is skipped, which
SGLang logs), so it is a subset of the wheel's. Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_runtime  # noqa: E402,F401  (GPU-only imports stood in, as every SGLang tool does)

OUT = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)  # SGLang's prints go to stderr: stdout is the JSON lines


def resolved(folder: str) -> dict:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    try:
        _, arch = get_model_architecture(ModelConfig(folder))
    except Exception as e:  # noqa: BLE001 - SGLang's refusal is the answer
        return {"folder": folder, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
    return {"folder": folder, "architecture": arch}


def main(argv: list[str]) -> int:
    if not argv:
        from sglang.srt.models.registry import ModelRegistry

        OUT.write(json.dumps({"registered": sorted(ModelRegistry.get_supported_archs())}) + "\n")
    for folder in argv:
        OUT.write(json.dumps(resolved(os.path.abspath(folder))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
