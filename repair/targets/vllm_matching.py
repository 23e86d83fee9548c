"""How vLLM decides that a layer is excluded from quantization, for ModelOpt and compressed-tensors.

`ModelOptQuantConfigBase.is_layer_excluded` tries, in order: an exact match (a fused layer
such as `gate_up_proj` matches only when every shard is listed, and only with a packed-modules
mapping, which the drafter's config never has), a plain substring test, then fnmatch. A
trailing `X*` pattern is also tried as `X` and `X.*`. Draft layers are matched under
`draft_model.` prefixes, not the checkpoint's `model.` names.

compressed-tensors (`should_ignore_layer`, `check_equal_or_regex_match`) is stricter: an entry
excludes a layer only when it equals the name or is `re:REGEX` with `re.match` (anchored at the
start), so `pre_projection` does not exclude `draft_model.pre_projection`. A layer no
config-group target names is not quantized either (`Linear` targets every linear layer).
"""

from __future__ import annotations

import re
import fnmatch
from functools import lru_cache
from typing import Iterable

from repair.io.parse import regex

FUSED_SHARDS = {"gate_up_proj": ("gate_proj", "up_proj")}


def is_excluded(prefix: str, exclusions: Iterable[str]) -> bool:
    """True when vLLM would build the layer at `prefix` unquantized."""
    patterns = tuple(exclusions)
    if prefix in patterns or any(pattern in prefix for pattern in patterns):
        return True
    globs = _globs(patterns)
    return globs is not None and globs.match(prefix) is not None


@lru_cache(maxsize=64)
def _globs(patterns: tuple[str, ...]) -> re.Pattern | None:
    """vLLM's fnmatch tests (a trailing `*` also tried as nothing and as `.*`) as one compiled regex:
    doctor asks this for every module of a 45k-module checkpoint against the same list."""
    variants = [v for p in patterns for v in [p] + ([p[:-1], p[:-1] + ".*"] if p.endswith("*") else [])]
    return re.compile("|".join(f"(?:{fnmatch.translate(v)})" for v in variants)) if variants else None


def ct_is_excluded(prefix: str, ignore: Iterable[str], targets: Iterable[str] | None = None) -> bool:
    """True when vLLM's compressed-tensors config builds the layer at `prefix` unquantized."""
    if any(ct_entry_matches(prefix, entry) for entry in ignore):
        return True
    listed = list(targets) if targets is not None else ["Linear"]
    return not any(t == "Linear" or ct_entry_matches(prefix, t) for t in listed)


def ct_entry_matches(prefix: str, entry: str) -> bool:
    """compressed-tensors' rule for one ignore or target entry: equal, or `re:` + re.match."""
    if entry.startswith("re:"):
        return regex(entry[3:], "compressed-tensors ignore/targets entry").match(prefix) is not None
    return entry == prefix


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
