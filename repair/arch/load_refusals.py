"""Checkpoint modules a profiled release's own load_weights raises on, as a row's `refused_modules` (doctor reports each
where the checkpoint stores tensors under it: doctor/config_builds.py unexpected_tensor_findings).

Two facts of the profile say so: `without.refused_only_with` (the build config.json chooses when it leaves fields null
has no parameter for them: Qwen4Exp's QSA indexer, arch/configured.py hands it over for such a config) and
`weight_refused` (tools/vllm_load_facts.py placed_weights: a module's weight fed alone to load_weights raises, Kimi-Linear's
layer 0 `block_sparse_moe.*` in vLLM 0.28/0.30; tools/vllm_expert_refusals.py, a variant's: MiniCPMMoE's NVFP4 expert
scales in 0.32, arch/variants.py hands it over). Each in the release's words, with what the user can do.
"""

from __future__ import annotations

import re

WITHOUT_REMEDY = ("remove those modules' tensors, or set those fields if the model was trained with the layers they "
                  "configure")
WEIGHT_REMEDY = ("store those tensors as this release's model loads them (its names; a module it builds without a "
                 "quantized method, such as MiniCPMMoE's experts, unquantized), or target a runtime or release that "
                 "loads them")


def refused_loads(label: str, source: str, name: str, entry: dict, fields: str,
                  all_refused: bool) -> tuple[tuple[str, str, str, str], ...]:
    """(checkpoint module or tensor pattern, the release's error, why, what to do) for each recorded refusal. A row
    whose every load is refused (`all_refused`: `load_refused`) says so once: no `weight_refused` of it."""
    without = tuple((p, error, f"{label} builds {name} without the layers {fields} configures where config.json leaves it "
                               f"null, as this one does, and that build's load_weights has no parameter for it (recorded "
                               f"in {source})", WITHOUT_REMEDY)
                    for p, error in sorted({(named_module(p, e), e) for p, e in entry.get("refused_only_with", {}).items()}))
    why = f"{label}'s {name} load_weights has no parameter it loads it into (its own code, recorded in {source})"
    refused = entry.get("weight_refused") if not all_refused else None
    weights = tuple((p, error, why, WEIGHT_REMEDY) for p, error in sorted(refused.items())
                    if isinstance(p, str) and isinstance(error, str)) if isinstance(refused, dict) else ()
    return without + weights


def named_module(pattern: str, error: str) -> str:
    """The checkpoint module pattern the release's error names (vLLM's weights loader: "There is no module or parameter
    named 'layers.*.self_attn.indexer'"), the part of `pattern` ending with it: every tensor under it raises the same;
    `pattern` itself where the error quotes no part of it."""
    quoted = re.search(r"'([^']+)'", error)
    at = f".{pattern}.".find(f".{quoted.group(1)}.") if quoted else -1
    return pattern[:at + len(quoted.group(1))] if at >= 0 else pattern
