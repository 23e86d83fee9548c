#!/usr/bin/env python
"""The `registry_renamed` block of repair/targets/data/sglang-<release>.json: the architecture SGLang's own config
classes write over config.json's `architectures`, asked of those classes.

    python -m tools.sglang_registry_renames [SGLANG_VENV]   (default /work/venvs/sglang; rewrites the installed release's file)

SGLang reads config.json with its own config class where it registers one for the model_type (`_CONFIG_REGISTRY`,
utils/hf_transformers/common.py), and some of them rewrite `architectures` before its registry is asked: 0.5.23's
DeepseekV41Config makes the published `["DeepseekV41ForCausalLM"]` `["DeepseekV4ForCausalLM"]`
(configs/deepseek_v41.py:38-39), the class it registers; others write their one class over any list. Each registered
class is built (in SGLang's venv) with `architectures` a one-name list, for every name a shipped release's registry
holds and SGLang's lacks (the names a config.json may list that SGLang does not build itself), and without the list
(key ""): model_type -> {listed name: the one name it writes}, where it writes another. A class that cannot be built so is not recorded, nor a list of
more than one name (arch/registry.py reads only one-name lists through it).
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DATA = Path(__file__).resolve().parents[1] / "repair" / "targets" / "data"


def probe(candidates: list[str]) -> dict[str, dict[str, str]]:
    """(In SGLang's venv) model_type -> {listed name: the name its config class writes instead}."""
    from tools import sglang_stubs

    sglang_stubs.install()
    from sglang.srt.utils.hf_transformers import common

    from tools.raised_by import reraise_ours

    out: dict[str, dict[str, str]] = {}
    for model_type, cls in sorted(common._CONFIG_REGISTRY.items()):
        try:  # a class whose constructor needs more than the list is not asked (its binding, not its code, refuses)
            inspect.signature(cls.__init__).bind(None, architectures=[])
        except TypeError:
            continue
        for name in ("", *candidates):  # "": config.json without `architectures` (Olmo3Config writes one then)
            try:
                written = (cls(architectures=[name]) if name else cls()).architectures
            except Exception as exc:  # noqa: BLE001 - a class needing more than the list: not asked
                reraise_ours(exc)
                break
            if written != [name] and isinstance(written, list) and len(written) == 1 and isinstance(written[0], str):
                out.setdefault(model_type, {})[name] = written[0]
    return out


def candidates(release: str) -> list[str]:
    """Every name a shipped release's registry holds and `release`'s SGLang registry lacks."""
    names, own = set(), set()
    for path in DATA.glob("*.json"):
        doc = json.loads(path.read_text(encoding="utf-8"))
        listed = doc.get("registry") or doc.get("rules", {}).get("registry") or ()
        (own if path.name == f"sglang-{release}.json" else names).update(listed)
    return sorted(names - own)


def generate(venv: Path) -> dict[str, dict[str, str]]:
    from tools.sglang_layer_drops import in_sglang

    release = in_sglang(venv, "--release", tool=Path(__file__))[0]
    with tempfile.NamedTemporaryFile("w", suffix=".json") as names:
        json.dump(candidates(release), names)
        names.flush()
        return in_sglang(venv, "--probe", names.name, tool=Path(__file__))[0]


def main(argv: list[str]) -> int:
    if argv[:1] in (["--probe"], ["--release"]):
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        if argv[0] == "--release":
            import importlib.metadata

            out.write(json.dumps(importlib.metadata.version("sglang")) + "\n")
        else:
            out.write(json.dumps(probe(json.loads(Path(argv[1]).read_text()))) + "\n")
        return 0
    from tools.sglang_built_layers import write_generated

    return write_generated([argv[0] if argv else "/work/venvs/sglang"], "registry_renamed", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
