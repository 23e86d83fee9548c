"""The architecture row as a target names its layers: where a runtime release's own model code asks its exclusion rules
about a layer under another name than the checkpoint module loaded into it (the release data's `layer_names`, generated
from its load: tools/sglang_layer_names.py), that name is the module's runtime name and the one an exclusion entry uses.

SGLang 0.5.23 fuses Gemma 4's vision `self_attn.q_proj.linear` (with k, v) into a QKVParallelLinear it asks about as
`...self_attn.qkv_proj`, whose shard is `...self_attn.q_proj` (sglang#24927): an entry naming the `.linear` module never
reaches it. Other modules keep the names the layer rows give them: a vLLM release's own profile `prefixes`; for
another runtime, whose rows are borrowed from a vLLM profile (`layer_rows`), the checkpoint's name, never vLLM's prefix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from repair import arch
from repair.arch.base import Architecture
from repair.arch.profiled import AskedPrefixes
from repair.arch.registry import Builds
from repair.targets.profiles import DATA_PROFILES


@dataclass(frozen=True)
class RenamedFirst:
    """The release's own name for a module where its data has one, else the layer rows' name."""

    renamed: AskedPrefixes
    rows: Callable[[str], str]

    def __call__(self, module: str) -> str:
        found = self.renamed(module)
        return found if found != module else self.rows(module)


def _pairs(rules, name: str | None) -> tuple[tuple[str, str], ...]:
    """A rules file's `layer_names` for `name`, the listed architecture its release builds (arch/registry.py)."""
    names = rules.layer_names.get(name or "") if rules is not None else None
    return tuple(sorted(names.items())) if names else ()


def release_names(target, config: dict | None, builds: Builds | None = None) -> Callable[[str], str] | None:
    """Checkpoint module -> the name the target release's own rules ask for it (its data's `layer_names`), else the
    module's own (None: every module's): how it groups stored modules into its fused layers (Gemma 4's vision
    `q_proj.linear` is a shard). `builds`: read_builds(config), when read."""
    pairs = _pairs(target.profile.rules, target.built(builds or config).name)
    return AskedPrefixes(pairs) if pairs else None


def target_family(target, config: dict | None, builds: Builds | None = None) -> Architecture:
    """The row of the class the target builds (`arch.architecture`, borrowed when the target is another runtime's
    rules file: vLLM's prefixes, refusals and drops are vLLM's code), with the target release's own layer names where
    its data has them. `builds`: read_builds(config), when read (doctor reads it once per run)."""
    built = target.built(builds or config)
    family = arch.architecture(config, target.release, borrowed=target.profile.rules is not None, built=built)
    pairs = _pairs(target.profile.rules, built.name)
    if not pairs:
        return family
    return replace(family, runtime_name=RenamedFirst(AskedPrefixes(pairs), family.runtime_name),
                   exclusion_name=RenamedFirst(AskedPrefixes(pairs, writable=True), family.exclusion_name))


def named_elsewhere(builds: Builds, modules) -> set[str]:
    """For the stored modules some shipped release asks about under another name (SGLang's layer_names, a vLLM
    release's profile prefixes: HYV3's shared_mlp.down_proj is `mlp.down_proj` to vLLM 0.28 only): the checkpoint's
    name and that release's. fix --target a,b writes both (each runtime reads one), so an entry naming either names a module of this
    model, whichever target doctor checks. `builds`: the class each release builds for config.json (read_builds)."""
    asked = [_pairs(p.rules, builds.of(p.rules.model_registry).name) for p in DATA_PROFILES]  # SGLang's layer_names
    built = [(p, builds.of(p.registry).name or "") for p in arch.PROFILES]  # the class each vLLM release builds
    asked += [tuple(sorted(p.entries[name]["prefixes"].items())) for p, name in built  # and that release's prefixes
              if name in p.entries and p.entries[name].get("prefixes")]
    out: set[str] = set()
    for pairs in filter(None, asked):
        renamed = AskedPrefixes(pairs)
        out |= {n for m in modules if (r := renamed(m)) != m for n in (m, r) if n}
    return out
