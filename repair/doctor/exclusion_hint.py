"""What exactly to write to exclude a stored-BF16 layer a rules release builds quantized, in that release's own rule.

"Exclude it" is not enough where the layer is a shard of a fused layer: the release builds the fused layer as one, so
its other shards must be excluded (and dequantized) with it, and a release that asks a fused layer only by its own
name (SGLang 0.5.9-0.5.10) reads none of the shards' entries. The release's own matcher (the bound declaration's
rule) is asked which entries, added to the list it reads, exclude every shard: the shards' names, else the shards'
and the fused layer's, as `fix --target` writes them (planning/runtime_entries.py).
"""

from __future__ import annotations

from repair.arch import Architecture
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule
from repair.targets.config_lists import flat_exclusions, list_sources, pattern_syntax


def exclusion_hint(name: str, modules: dict[str, StoredModule], declaration: Declaration, family: Architecture,
                   config: dict | None) -> str | None:
    """"write `a`, `b` in <file and key>[ and dequantize `c`]" for stored module `name`; None where no entries the
    release reads exclude it (its layer is then not the list's to change)."""
    fused, members = next(((f, ms) for f, ms in family.fused_groups(modules) if name in ms), (None, (name,)))
    read = tuple(declaration.exclusions)
    shards = sorted(dict.fromkeys(family.exclusion_name(m) for m in members))
    for entries in (shards, [*shards, fused] if fused else None):
        if entries is None:
            continue
        rule = declaration.rule(read + tuple(e for e in entries if e not in read))
        if all(rule.excludes(family.runtime_name(m)) for m in members):
            break
    else:
        return None
    if any(pattern_syntax(e) for e in entries):
        return None  # no entry names exactly it (fix_hints says so): writing it would exclude other layers, or none
    where = list_sources(declaration, config, flat_exclusions(config)).get(read) or "the exclusion list"
    written = ", ".join(f"`{e}`" for e in entries if e not in read)
    others = [f"`{m}`" for m in sorted(members) if m != name and modules[m].is_quantized]
    also = f" and dequantize {' and '.join(others)}, built in the same BF16 layer" if others else ""
    return f"write {written} in {where}{also}"
