"""How vLLM decides that a layer is excluded from ModelOpt quantization.

`ModelOptQuantConfigBase.is_layer_excluded` tries, in order: an exact match (a fused layer
such as `gate_up_proj` matches only when every shard is listed, and only with a packed-modules
mapping, which the drafter's config never has), a plain substring test, then fnmatch. A
trailing `X*` pattern is also tried as `X` and `X.*`. Draft layers are matched under
`draft_model.` prefixes, not the checkpoint's `model.` names.
"""

from __future__ import annotations

from fnmatch import fnmatch
from typing import Iterable

FUSED_SHARDS = {"gate_up_proj": ("gate_proj", "up_proj")}


def is_excluded(prefix: str, exclusions: Iterable[str]) -> bool:
    """True when vLLM would build the layer at `prefix` unquantized."""
    patterns = list(exclusions)
    if prefix in patterns:
        return True
    for pattern in patterns:
        if pattern in prefix:
            return True
        variants = [pattern] + ([pattern[:-1], pattern[:-1] + ".*"] if pattern.endswith("*") else [])
        if any(fnmatch(prefix, v) for v in variants):
            return True
    return False


def draft_prefix(module: str) -> str:
    """The quantization prefix vLLM gives a Gemma 4 assistant module (checkpoint name in)."""
    if module.startswith("model."):
        module = "draft_model." + module[len("model."):]
    elif module in ("pre_projection", "post_projection"):
        module = "draft_model." + module
    for fused, shards in FUSED_SHARDS.items():
        for shard in shards:
            if module.endswith("." + shard):
                return module[: -len(shard)] + fused
    return module
