"""The registry of runtime matching rules: rule name -> function. A runtime release's data file names, per config
kind, the rule it applies (`rules.matchers` in repair/targets/data/<runtime>-<release>.json); adding a release is
adding a file, adding a rule is adding a function here (or in its own module) and its name to these tables.

Exclusion matchers (`modelopt`, `compressed-tensors` kinds) take (entries, targets, building) and return a compiled
rule with `excludes(name)`, `shard_excluded(name)` and `fused_refusal(fused, shards)` (the runtime's error building
that fused layer, or None); names are runtime module names, a checkpoint shard or expert answering for the layer
the runtime builds it into (`building`: repair/targets/sglang_match.Building). Layer-map matchers
(`quantized_layers` kind) take (layer algorithms, name, building) and return (algorithm or None, error or None).
"""

from __future__ import annotations

from typing import Callable

from repair.errors import UsageError
from repair.formats.algorithms import LayerAlgorithms
from repair.io.patterns import MATCH, RegexSet
from repair.targets.sglang_match import (ALIAS_SWAPS, LANGUAGE_SWAPS, Building, CtTargets, ExcludedGlobs, SglangCtRule,
                                         SglangModelOptRule, SkippedList, resolve_layer)
from repair.targets import sglang_dsv4_fp8, trtllm_match

ExclusionMatcher = Callable[[tuple[str, ...], "tuple[str, ...] | None", Building], object]
LayerMatcher = Callable[[LayerAlgorithms, str, Building], "tuple[str | None, str | None]"]
KINDS = ("modelopt", "compressed-tensors", "quantized_layers")


def _sglang_modelopt(dotted: bool, experts_or: bool, strip: bool = True) -> ExclusionMatcher:
    def build(entries: tuple[str, ...], targets, building: Building) -> SglangModelOptRule:
        return SglangModelOptRule(SkippedList(tuple(entries), dotted, experts_or, strip), ExcludedGlobs.compile(tuple(entries)),
                                  building)
    return build


def _sglang_ct(suffix: bool) -> ExclusionMatcher:
    def build(entries: tuple[str, ...], targets, building: Building) -> SglangCtRule:
        regexes = RegexSet.compile([e[3:] for e in entries if e.startswith("re:")], MATCH, "compressed-tensors ignore entry")
        found = targets if isinstance(targets, CtTargets) else CtTargets.compile(targets)  # compiled once by the caller
        return SglangCtRule(tuple(entries), suffix, building, regexes, found.listed, found.regexes)
    return build


def _sglang_layers(aliases: tuple) -> LayerMatcher:
    def lookup(layers: LayerAlgorithms, name: str, building: Building):
        return resolve_layer(layers, name, building, aliases)
    return lookup


def _unsupported(layers: LayerAlgorithms, name: str, building: Building):
    return None, None  # the release has no per-layer map (the data's refusals say what it does with MIXED_PRECISION)


EXCLUSION_MATCHERS: dict[str, ExclusionMatcher] = {
    # is_layer_skipped substring, experts entries replace the plain match (0.5.9); + is_layer_excluded globs
    "sglang_modelopt_substring_experts_only": _sglang_modelopt(dotted=False, experts_or=False),
    "sglang_modelopt_substring": _sglang_modelopt(dotted=False, experts_or=True),  # 0.5.10
    "sglang_modelopt_dotted_as_written": _sglang_modelopt(dotted=True, experts_or=True, strip=False),  # 0.5.11/0.5.12
    "sglang_modelopt_dotted": _sglang_modelopt(dotted=True, experts_or=True),  # 0.5.13+: _module_path_match, `.` stripped
    "sglang_ct_contains": _sglang_ct(suffix=False),  # check_contains=True: case-insensitive substring
    "sglang_ct_suffix": _sglang_ct(suffix=True),  # exact or dotted suffix, never a parent
    "sglang_dsv4_fp8_hybrid": sglang_dsv4_fp8.hybrid,  # 0.5.23's HybridFp8NvFp4Config, where `reading_refusal` is None
    **trtllm_match.EXCLUSION_MATCHERS,  # TensorRT-LLM's, in their own module
}
LAYER_MATCHERS: dict[str, LayerMatcher] = {
    "sglang_layers_exact": _sglang_layers(aliases=()),  # 0.5.10-0.5.14: the prefix itself
    "sglang_layers_language_swaps": _sglang_layers(aliases=LANGUAGE_SWAPS),  # 0.5.15-0.5.19: lm_head, VL text stack
    "sglang_layers_aliases": _sglang_layers(aliases=ALIAS_SWAPS),  # 0.5.20+: also model. <-> model.language_model.
    "none": _unsupported,
    **trtllm_match.LAYER_MATCHERS,
}


# matcher -> (config.json, the class's built_layers, the release's name) -> why its reading is not the one the matcher
# answers for (None: it is); bound before the matcher (RuntimeRules.bind), refused in one line
READING_REFUSALS: dict[str, Callable[[dict | None, dict, str], str | None]] = {
    "sglang_dsv4_fp8_hybrid": sglang_dsv4_fp8.refusal}
# matcher -> (the release's name) -> why no exclusion entry fix could write is read there (doctor's advice for a BF16 layer)
UNREAD_ENTRIES: dict[str, Callable[[str], str]] = {"sglang_dsv4_fp8_hybrid": sglang_dsv4_fp8.unread_entries}


def exclusion_matcher(name: str) -> ExclusionMatcher:
    """The registered exclusion rule `name` (a data file naming an unknown one is our bug: said in one line)."""
    return _registered(EXCLUSION_MATCHERS, name, "exclusion")


def layer_matcher(name: str) -> LayerMatcher:
    return _registered(LAYER_MATCHERS, name, "quantized_layers")


def _registered(table: dict, name: str, kind: str):
    try:
        return table[name]
    except KeyError:
        raise UsageError(f"runtime profile names {kind} matcher {name!r}, which is not registered "
                         f"(known: {', '.join(sorted(table))})") from None
