"""What vLLM refuses while reading a config or building the model from it, in its own words (run in .venv-vllm;
tools/vllm_profile.py records the answers).

`refusal_site(error)`: whether an exception that stopped the profile's build is the release refusing the config (raised
by a `raise` in vLLM's own code: vLLM 0.30's qwen4_exp/nvidia/model.py:237 `Invalid layer_type indexed_attention` on
the layer type transformers' Qwen4ExpConfig writes) or this host failing to build it (an import a GPU-only kernel
package lacks here, a CUDA-only torch call, transformers' config lacking a field vLLM reads that published configs may
carry): only the first is a fact about the release.

`refusal_condition`: what in the config the refusal is about, where building without that field succeeds.

`null_refused` / `value_refused`: for a row built two ways (`without`), what the release's config loading (transformers'
config class, which vLLM runs) raises on a config with some of the build's fields null (every proper subset), or with
values set but outside what its validator takes (VALUE_RULES, tools/vllm_profile_configs.py: each rule is asked with two
probe values, and recorded only if vLLM refuses both; where the two errors differ the part they share is kept, so
the text is the release's own words, none of the probe's values).
Imports nothing from ``repair``.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
import traceback
from raised_by import reraise_ours

NOT_REFUSALS = (ImportError,)  # an import failing here is a package this host lacks (cutlass, a GPU-only kernel)


def refusal_site(error: BaseException) -> str | None:
    """`vllm/...py:LINE` where vLLM's own code raised `error` (the innermost frame is in the vllm package), None when
    it was raised anywhere else (torch's CUDA stubs, transformers' attribute lookup, an import)."""
    import vllm

    if isinstance(error, NOT_REFUSALS):
        return None
    frames = traceback.extract_tb(error.__traceback__)
    root = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    inside = os.path.join(root, "vllm") + os.sep
    if not frames or not os.path.abspath(frames[-1].filename).startswith(inside):
        return None
    return f"{os.path.relpath(frames[-1].filename, root)}:{frames[-1].lineno}"


def refusal_condition(config: dict, error: BaseException, builds) -> dict | None:
    """{"field", "holds"}: the config field (of its text part) holding a value vLLM's error quotes, where the model
    builds without that field (`builds(config) -> bool`: vLLM's own config class derives it then): vLLM 0.30's
    `Invalid layer_type indexed_attention` refuses the layer type transformers' Qwen4ExpConfig writes into
    `layer_types`, not the model (published configs write `full_attention` there). None: no such field confirmed,
    so the refusal holds for every config."""
    words = set(re.findall(r"[A-Za-z0-9_.-]+", str(error)))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    part = text if text is not None else config
    for field, value in part.items():
        held = [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and v in words]
        if not held:
            continue
        without = {k: v for k, v in part.items() if k != field}
        if builds({**config, "text_config": without} if text is not None else without):
            return {"field": field, "holds": held[0]}
    return None


def config_error(folder: str) -> str | None:
    """vLLM's error reading config.json in `folder` as `vllm serve` does (None: it takes it)."""
    from vllm.engine.arg_utils import EngineArgs

    try:
        EngineArgs(model=folder, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128, enforce_eager=True,
                   load_format="dummy", trust_remote_code=False, enable_prefix_caching=False).create_engine_config()
    except Exception as e:  # noqa: BLE001 - recorded: the release refuses such a config while reading it
        reraise_ours(e)
        return f"{type(e).__name__}: {e}"
    return None


def asked(write_config, arch: str, config: dict, refused: list[str]) -> str | None:
    with tempfile.TemporaryDirectory() as folder:
        write_config(folder, arch, config, refused)
        return config_error(folder)


def null_refused(write_config, arch: str, config: dict, refused: list[str], fields: tuple[str, ...]) -> dict[str, str]:
    """"f1,f2" (the null fields, in `fields`' order) -> vLLM's error on the profiled config with those fields null and
    the others as profiled, for every proper subset; subsets it accepts are left out."""
    out = {}
    for size in range(1, len(fields)):
        for null in itertools.combinations(fields, size):
            error = asked(write_config, arch, {**config, **dict.fromkeys(null)}, refused)
            if error is not None:
                out[",".join(null)] = error
    return out


def value_refused(write_config, arch: str, config: dict, refused: list[str], rules: tuple[dict, ...]) -> list[dict]:
    """Each rule vLLM's config loading enforces, with its words: the rule (as VALUE_RULES writes it) and `error`, the
    part of its two probes' errors they share (cut at the last ": " where they differ)."""
    out = []
    for rule in rules:
        errors = [asked(write_config, arch, {**config, **probe}, refused) for probe in rule["probes"]]
        if None in errors:
            continue  # the release takes a probe: it does not enforce this rule
        out.append({k: v for k, v in rule.items() if k != "probes"} | {"error": shared_words(errors)})
    return out


def shared_words(errors: list[str]) -> str:
    """The errors' common text: the whole when they agree, else their common prefix cut at its last ": " outside
    brackets (the values the message lists come after it: "ValueError: QSA config values must be positive")."""
    common = os.path.commonprefix(errors)
    if all(e == common for e in errors):
        return common
    depth, cut = 0, len(common)
    for i, c in enumerate(common):
        depth += (c in "([{") - (c in ")]}")
        if depth == 0 and common.startswith(": ", i):
            cut = i
    return common[:cut]
