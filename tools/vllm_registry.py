#!/usr/bin/env python
"""Which model class vLLM builds for a config's `architectures`, from vLLM's own registry (run in a vLLM venv).

    vllm_registry.py                 the registry facts (one JSON line): what tools/vllm_profile.py records, and `release`
    vllm_registry.py DIR [DIR ...]   one JSON line per folder: the class vLLM resolves for its config.json, or its error

`registry`: every name the release's whole registry takes (`ModelRegistry.get_supported_archs()`: text generation,
multimodal, pooling, speculative, the Transformers-backend names). vLLM builds the first listed name the registry has
(model_executor/models/registry.py, `resolve_model_cls`: the loop over `architectures`). When NONE of the listed names
is registered, `model_impl="auto"` falls back to the Transformers backend for the FIRST name, if transformers has a model
class of that name that the backend accepts (`_try_resolve_transformers`); `transformers_fallback` lists those names
(the transformers installed beside this vLLM), so a name in neither list is refused with `unsupported`, vLLM's own
`_raise_for_unsupported` text (its first sentence: the rest lists the whole registry), or `retired`'s where the first
such listed name is one vLLM names a release or a plugin for; `malformed`, the sentence its config validation refuses a
non-list `architectures` or a non-string entry with; `unlisted`, the class it names from model_type when none is listed
(transformers' MODEL_MAPPING_NAMES, as its get_config reads it) and its refusal when it names none. The per-folder mode asks vLLM
itself (`EngineArgs(...).create_engine_config()`, as `vllm serve` does): the tier checks doctor's reading against it.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

from vllm_runtime import emit, torchvision_stand_in
from raised_by import reraise_ours

UNKNOWN = ["NotARegisteredNameForCausalLM"]  # a name no registry and no transformers has: vLLM's refusal, asked of vLLM
MALFORMED = {"list": "LlamaForCausalLM", "string": ["LlamaForCausalLM", 7]}  # `architectures` a string; a non-string entry
SMALL = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 1,
         "num_key_value_heads": 2, "vocab_size": 256, "torch_dtype": "bfloat16"}


def registry_facts() -> dict:
    """{"registry", "transformers_fallback", "unsupported"} of this release, from its registry's own functions."""
    from vllm.model_executor.models.registry import ModelRegistry

    from vllm.model_executor.models import registry

    registered = sorted(ModelRegistry.get_supported_archs())
    retired = {**getattr(registry, "_PREVIOUSLY_SUPPORTED_MODELS", {}), **getattr(registry, "_OOT_SUPPORTED_MODELS", {})}
    return {"registry": registered, "transformers_fallback": sorted(fallback_names(set(registered))),
            "unsupported": unsupported_text(ModelRegistry, UNKNOWN),
            "retired": {name: unsupported_text(ModelRegistry, [name]) for name in sorted(retired) if name not in registered},
            "malformed": malformed_refusals(), "suffixes": suffix_defaults(), "unlisted": unlisted_facts(ModelRegistry)}


def unlisted_facts(registry) -> dict:
    """What vLLM does with a config.json listing no architectures (absent, null or []): its get_config names the class
    from model_type, by the transformers beside it (transformers_utils/config.py: `MODEL_MAPPING_NAMES[model_type]`,
    a base model such as LlamaModel, which the registry then builds converted); a model_type it maps to no single
    class leaves the list empty, which the registry refuses (`inspect_model_cls`: its words, `refused`)."""
    from vllm.transformers_utils.config import MODEL_MAPPING_NAMES

    try:
        registry.inspect_model_cls([], None)
    except ValueError as e:
        refused = str(e)
    else:
        raise AssertionError("vLLM resolved an empty architectures list")
    return {"classes": {k: v for k, v in sorted(MODEL_MAPPING_NAMES.items()) if isinstance(v, str)}, "refused": refused}


def suffix_defaults() -> list[list[str]]:
    """[suffix, runner, convert] in vLLM's order (config/model.py `iter_architecture_defaults`): a name it does not
    register whose suffix is one of these is built as the first registered name with another of them in its place
    (registry.py `_normalize_arch`), converted (a pooling or classify head on the causal LM)."""
    from vllm.config.model import iter_architecture_defaults

    return [[suffix, runner, convert] for suffix, (runner, convert) in iter_architecture_defaults()]


def malformed_refusals() -> dict[str, str]:
    """{"list" | "string": the sentence vLLM's config validation gives}: what `vllm serve` says of a config whose
    `architectures` is not a list ("list"), or lists a non-string ("string"); a form it takes is left out."""
    out = {}
    for key, listed in MALFORMED.items():
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(dict(SMALL, architectures=listed), f)
            error = resolved(folder).get("error", "")
        said = [line.strip().split(" [type=")[0] for line in error.splitlines() if line.strip().startswith("Input should be")]
        if said:
            out[key] = said[0]
    return out


def fallback_names(registered: set[str]) -> list[str]:
    """transformers' top-level model classes, not registered, that `_try_resolve_transformers` takes for a config
    without auto_map (its two tests: a PreTrainedModel subclass, backend-compatible or able to set its attention)."""
    import transformers

    out = []
    for name in dir(transformers):
        if name in registered or not name[:1].isupper():
            continue
        try:
            cls = getattr(transformers, name)
        except Exception as e:  # noqa: BLE001 - a lazily imported class whose dependency is missing here: not importable
            reraise_ours(e)
            continue
        if isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel) and backend_takes(cls):
            out.append(name)
    return out


def backend_takes(cls) -> bool:
    try:
        return bool(cls.is_backend_compatible() or cls._can_set_attn_implementation())
    except Exception as e:  # noqa: BLE001 - vLLM's own test raises too: no fallback for it
        reraise_ours(e)
        return False


def unsupported_text(registry, names: list[str]) -> str:
    """vLLM's refusal of a config listing `names` only (`_raise_for_unsupported`), the listed names as
    `{architectures}`: its first sentence where it goes on to list the whole registry; whole where it names a
    retired name (a release that served it, or the plugin that does)."""
    try:
        registry._raise_for_unsupported(names)
    except ValueError as e:
        return str(e).split(". Supported architectures:")[0].replace(str(names), "{architectures}").rstrip(".") + "."
    raise AssertionError("vLLM accepted a name it does not register")


def resolved(folder: str) -> dict:
    """The architecture vLLM resolves for the folder's config.json (its ModelConfig's `architecture`, and the runner it
    builds it for), or its error."""
    from vllm.engine.arg_utils import EngineArgs

    try:
        vc = EngineArgs(model=folder, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128, enforce_eager=True,
                        load_format="dummy", trust_remote_code=False).create_engine_config()
    except Exception as e:  # noqa: BLE001 - vLLM's refusal is the answer
        reraise_ours(e)
        return {"folder": folder, "error": f"{type(e).__name__}: {str(e)[:2000]}"}
    return {"folder": folder, "architecture": vc.model_config.architecture, "runner": vc.model_config.runner_type}


def main(argv: list[str]) -> int:
    torchvision_stand_in()
    if not argv:
        import vllm

        emit({"release": vllm.__version__.split("+")[0], **registry_facts()})
    for folder in argv:
        emit(resolved(os.path.abspath(folder)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
