"""TensorRT-LLM's rules for which layers a config's lists leave unquantized, release by release, as functions of the data.

TensorRT-LLM does not install here: these are derived from pinned source (tests/data/trtllm/PROVENANCE.md names
repository, path and commit of each): `QuantConfig.is_module_excluded_from_quantization` in three versions,
`apply_quant_config_exclude_modules` (fused layers: the fused name only, or any shard) and
`apply_layerwise_quant_config` (MIXED_PRECISION). A rule is asked with checkpoint-side runtime names (a shard
`...q_proj`) and answers for the layer TensorRT-LLM builds them into (the fused `...qkv_proj`). TensorRT-LLM never
raises on fused shards that disagree: one excluded shard makes the whole fused layer BF16 (from 1.1).
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from types import MappingProxyType

from repair.formats.algorithms import LayerAlgorithms
from repair.io.patterns import FULLMATCH, RegexSet
from repair.targets.sglang_match import Building

REGEX_PREFIX = "re:"
GLOB = re.compile(r"[*?\[]")  # fnmatch's metacharacters: an entry without one matches exactly itself
# _load_weights_impl's params_map and apply_quant_config_exclude_modules' candidates: the only layers TensorRT-LLM's
# generic loader fuses from checkpoint shards (a model's own fusions, DeepSeek's MLA fused_a, load in model code)
FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def trtllm_building(building: Building) -> Building:
    """The model's fusions that TensorRT-LLM's generic loader makes (qkv_proj, gate_up_proj where the model has them)."""
    fusions = {leaf: shards for leaf, shards in building.fusions.items() if FUSED.get(leaf) == tuple(shards)}
    return Building(MappingProxyType(fusions), building.packed, False, building.own)


@dataclass(frozen=True)
class Matching:
    """One version of is_module_excluded_from_quantization."""

    ancestors: bool  # the name and every dotted ancestor are tried (PR #13844)
    regexes: bool  # `re:` entries are re.fullmatch patterns (PR #13844); before, an fnmatch glob like any other
    dotstar_parent: bool  # an entry `X.*` also matches X itself (later main)


FNMATCH = Matching(ancestors=False, regexes=False, dotstar_parent=False)
ANCESTORS_RE = Matching(ancestors=True, regexes=True, dotstar_parent=False)
ANCESTORS_RE_DOTSTAR = Matching(ancestors=True, regexes=True, dotstar_parent=True)


def _globs(entries: list[str]) -> re.Pattern | None:
    """fnmatchcase over many entries as one regex (each translation is linear-time: `*` an atomic group)."""
    return re.compile("|".join(f"(?:{fnmatch.translate(e)})" for e in entries)) if entries else None


@dataclass(frozen=True)
class TrtllmExclusions:
    """One exclusion list under one release's matching, compiled once: `excludes(name)` is the source's answer for
    one module name (candidates: the name, and its dotted ancestors when the release walks them)."""

    matching: Matching
    literals: frozenset[str]  # entries without a glob character: one set lookup (as the source's own fast path)
    globs: re.Pattern | None
    regexes: RegexSet | None
    parents: re.Pattern | None  # `X.*` entries' X, where the release also matches the parent

    @classmethod
    def compile(cls, entries: tuple[str, ...], matching: Matching) -> "TrtllmExclusions":
        plain = [e for e in entries if not (matching.regexes and e.startswith(REGEX_PREFIX))]
        regexes = [e[len(REGEX_PREFIX):] for e in entries if matching.regexes and e.startswith(REGEX_PREFIX)]
        parents = [e[:-2] for e in plain if e.endswith(".*")] if matching.dotstar_parent else []
        literals = frozenset(e for e in plain if not GLOB.search(e))
        return cls(matching, literals, _globs([e for e in plain if e not in literals]),
                   RegexSet.compile(regexes, FULLMATCH, "exclusion entry (TensorRT-LLM re: pattern)") if regexes else None,
                   _globs(parents))

    def excludes(self, name: str) -> bool:
        candidate = name
        while True:
            if self._matches(candidate):
                return True
            if not self.matching.ancestors or "." not in candidate:
                return False
            candidate = candidate.rsplit(".", 1)[0]

    def _matches(self, candidate: str) -> bool:
        return bool(candidate in self.literals or (self.globs is not None and self.globs.match(candidate)) or
                    (self.regexes is not None and self.regexes.matches(candidate)) or
                    (self.parents is not None and self.parents.match(candidate)))


@dataclass(frozen=True)
class TrtllmRule:
    """apply_quant_config_exclude_modules over one list: the layer a name is built into is unquantized when the
    list excludes its runtime name or, with `any_shard`, any of its shards' names (vLLM and SGLang raise on such a
    mix instead). Never a refusal: TensorRT-LLM builds whatever the lists decide."""

    exclusions: TrtllmExclusions
    building: Building
    any_shard: bool

    def excludes(self, prefix: str) -> bool:
        layer, kind = self.building.built_layer(prefix)
        leaf = layer.rpartition(".")[2]
        if kind != "fused" and leaf not in self.building.fusions:  # asked with a shard, or with the fused name itself
            return self.exclusions.excludes(layer)
        names = [layer] + ([layer[: -len(leaf)] + s for s in self.building.fusions[leaf]] if self.any_shard else [])
        return any(self.exclusions.excludes(n) for n in names)

    def shard_excluded(self, prefix: str) -> bool:
        return self.excludes(prefix)

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        return None


def trtllm_rule(matching: Matching, any_shard: bool):
    """The registry entry (repair/targets/matchers.py) for one matching version and fused policy."""
    def build(entries: tuple[str, ...], targets, building: Building) -> TrtllmRule:
        return TrtllmRule(TrtllmExclusions.compile(tuple(entries), matching), trtllm_building(building), any_shard)
    return build


def layerwise(layers: LayerAlgorithms, name: str, building: Building) -> tuple[str | None, str | None]:
    """apply_layerwise_quant_config: a MoE takes the first key (file order) containing its name; a fused gate_up the
    first containing `<parent>.gate_proj` or `<parent>.gate_up_proj`; a fused qkv the first containing
    `<parent>.q_proj`; any other linear an exact key. No key: the global MIXED_PRECISION config, i.e. unquantized."""
    building = trtllm_building(building)
    layer, kind = building.built_layer(name)
    parent, _, leaf = layer.rpartition(".")
    kind = "fused" if leaf in building.fusions else kind  # asked with the fused name itself
    if kind == "moe":
        wanted: tuple[str, ...] = (layer,)
    elif kind == "fused" and "gate_proj" in building.fusions.get(leaf, ()):
        wanted = (f"{parent}.gate_proj", f"{parent}.gate_up_proj")
    elif kind == "fused" and "q_proj" in building.fusions.get(leaf, ()):
        wanted = (f"{parent}.q_proj",)
    else:
        found = layers.entry(layer)
        return (found.upper() if found else None), None
    for key, algo in layers.entries:
        if any(w in key for w in wanted):
            return algo.upper(), None
    return None, None


# registered in repair/targets/matchers.py: rule name -> builder (the fused policy is part of the rule's name, and the
# data's `fused.policy` says the same; tests/test_runtime_trtllm_data.py checks they agree)
EXCLUSION_MATCHERS = {
    "trtllm_fnmatch_fused_name": trtllm_rule(FNMATCH, any_shard=False),  # 1.0: fnmatch, the fused name only
    "trtllm_fnmatch": trtllm_rule(FNMATCH, any_shard=True),  # 1.1/1.2: fnmatch, any shard excludes the fused layer
    "trtllm_ancestors_re": trtllm_rule(ANCESTORS_RE, any_shard=True),  # PR #13844: ancestors and re: fullmatch
    "trtllm_ancestors_re_dotstar": trtllm_rule(ANCESTORS_RE_DOTSTAR, any_shard=True),  # + `X.*` matches X
}
LAYER_MATCHERS = {"trtllm_layerwise": layerwise}
