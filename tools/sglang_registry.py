#!/usr/bin/env python
"""Which model class SGLang builds for a config's `architectures`, asked of SGLang itself (run in the SGLang venv).

    sglang_registry.py DIR [DIR ...]   one JSON line per folder: the class `get_model_architecture` resolves for its
                                       config.json (SGLang's own ModelConfig), or its error
    sglang_registry.py                 one JSON line: the names its registry imports here (`registered`), and what
                                       its Transformers backend does with a name none of them is (`transformers_backend`)

The shipped rules file's `registry` is read from the wheel (tools/sglang_rules_data.py: every EntryClass); here the
installed registry is what imports on this host (a model file whose GPU-only dependency is missing is skipped, which
SGLang logs), so it is a subset of the wheel's.

`transformers_backend` is asked of SGLang's own gate (model_loader/utils.py `resolve_transformers_arch`, which
`get_model_architecture` runs with model_impl="auto" when no listed name is registered): every top-level name of the
transformers installed beside it (its dunders and private names too: the gate asks `getattr(transformers, name)`, and
`__name__` is a string, so it passes), one at a time, is `takes` (the gate returns: the backend builds the model) or
refused (`refuses`: its ValueError, the name as `{architecture}`, -> the names), or `unanswered` (its class does
not import on this host, e.g. an audio processor needing librosa: the serving host's packages decide); `missing` is its error for a name
transformers lacks; `auto_map` the error for such a name when config.json's auto_map has that key and its code does
not load (a key absent from it changes nothing); `asks` is "each" when a taken name listed before a missing one is
refused too (the gate asks every listed name), else "first"; `unlisted`, its error for each
form of an `architectures` that lists no class name (absent, null, [], a mapping, "", a string, a first entry that is no
string, a number: SGLang reads `architectures[0]` as a string while loading the config; `entry_not_a_string`: any
later entry no string, which the gate lowers before asking any name); `skips`, the leading words of registered names (e.g.
"Transformers") with which an unknown name passes the gate unasked. Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_runtime  # noqa: E402,F401  (GPU-only imports stood in, as every SGLang tool does)
from tools.raised_by import reraise_ours  # noqa: E402

OUT = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)  # SGLang's prints go to stderr: stdout is the JSON lines


def resolved(folder: str) -> dict:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.utils import get_model_architecture

    try:
        _, arch = get_model_architecture(ModelConfig(folder))
    except Exception as e:  # noqa: BLE001 - SGLang's refusal is the answer
        reraise_ours(e)
        return {"folder": folder, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
    return {"folder": folder, "architecture": arch}


UNKNOWN = "NotARegisteredNameForCausalLM"  # a name no registry and no transformers has
AUTO_MAP_KEYS = ("AutoModel", "AutoModelForCausalLM", "AutoConfig")  # auto_map keys asked: each naming code that is absent


def gate(names: list[str], folder: str, auto_map: dict | None = None) -> str | None:
    """SGLang's Transformers-backend gate on a config listing `names` (generation, model_impl="auto"): None when it
    takes them, else its error."""
    from types import SimpleNamespace

    from sglang.srt.configs.model_config import ModelImpl
    from sglang.srt.model_loader.utils import resolve_transformers_arch

    hf = SimpleNamespace(auto_map=auto_map)
    config = SimpleNamespace(is_generation=True, is_multimodal=False, hf_config=hf, hf_text_config=hf,
                             model_impl=ModelImpl.AUTO, model_path=folder, revision=None)
    try:
        resolve_transformers_arch(config, names)
    except Exception as e:  # noqa: BLE001 - the gate's refusal (ValueError, or a class's ImportError here) is the answer
        reraise_ours(e)
        return f"{type(e).__name__}: {e}"
    return None


def backend_facts(registered: list[str]) -> dict:
    """What SGLang's Transformers backend does with each name its registry lacks (see the module docstring)."""
    import re
    import tempfile

    import transformers

    words = sorted({m.group() for n in registered if (m := re.match(r"[A-Z][a-z0-9]*", n))})

    takes, refuses, unanswered = [], {}, []
    with tempfile.TemporaryDirectory() as folder:  # no auto_map code in it: a key's module never loads
        for name in sorted(set(dir(transformers)) | set(dir(type(transformers)))):  # and dunders: `getattr` answers them
            said = gate([name], folder)
            if said is None:
                takes.append(name)
            elif said.startswith("ValueError: "):
                refuses.setdefault(said.replace(name, "{architecture}"), []).append(name)
            else:  # its class does not import here (a package this host lacks): the serving host's answer may differ
                unanswered.append(name)
        missing = gate([UNKNOWN], folder).replace(UNKNOWN, "{architecture}")
        auto_map = {k: said.replace(UNKNOWN, "{architecture}") for k in AUTO_MAP_KEYS
                    if (said := gate([UNKNOWN], folder, {k: "absent_module.Absent"})) != missing.replace("{architecture}", UNKNOWN)}
        asks = "each" if takes and gate([takes[0], UNKNOWN], folder) is not None else "first"
        skips = [w for w in words if gate([w + UNKNOWN], folder) is None]
        entry = gate([UNKNOWN, 5], folder)  # an entry no string anywhere, before any name is asked (_is_moe_model)
    return {"transformers": transformers.__version__, "asks": asks, "skips": skips, "missing": missing, "auto_map": auto_map,
            "refuses": {k: v for k, v in sorted(refuses.items()) if k != missing}, "unanswered": unanswered,
            "unlisted": dict(unlisted_facts(), entry_not_a_string=entry and entry.replace("'int'", "'{type}'")), "takes": takes}


LLAMA = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4, "num_hidden_layers": 1,
         "intermediate_size": 128, "vocab_size": 128}
UNLISTED = {"absent": ..., "null": None, "empty": [], "mapping": {"LlamaForCausalLM": 1}, "empty_string": "",
            "string": "LlamaForCausalLM", "not_a_string": [5], "number": 5}  # `architectures` listing no class name, each form once


def unlisted_facts() -> dict:
    """Each form of UNLISTED asked of SGLang's ModelConfig and get_model_architecture (a llama config): its error, the
    first character of a string as `{first}` and the type of a first entry that is no string as `{type}`."""
    import tempfile

    said = {}
    with tempfile.TemporaryDirectory() as root:
        for form, listed in UNLISTED.items():
            folder = os.path.join(root, form)
            os.mkdir(folder)
            config = dict(LLAMA) if listed is ... else dict(LLAMA, architectures=listed)
            with open(os.path.join(folder, "config.json"), "w", encoding="utf-8") as f:
                json.dump(config, f)
            error = resolved(folder).get("error")
            said[form] = error and error.replace("'L'", "'{first}'").replace("'int'", "'{type}'")
    return said


def main(argv: list[str]) -> int:
    if not argv:
        from sglang.srt.models.registry import ModelRegistry

        registered = sorted(ModelRegistry.get_supported_archs())
        OUT.write(json.dumps({"registered": registered, "transformers_backend": backend_facts(registered)}) + "\n")
    for folder in argv:
        OUT.write(json.dumps(resolved(os.path.abspath(folder))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
