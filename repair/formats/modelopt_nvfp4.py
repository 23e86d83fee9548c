"""ModelOpt's NVFP4 checkpoint format: how its tensors group into modules and how its two
config files declare exclusions.

Tensors per quantized Linear: `weight` uint8 [out, in/2], `weight_scale` float8_e4m3fn
[out, in/16], `weight_scale_2` float32 scalar, optional `input_scale`. Declarations live in
config.json `quantization_config.ignore` (read first by vLLM) and hf_quant_config.json
`quantization.exclude_modules` (read first by TensorRT-LLM); we always keep them in agreement.

vLLM's exclusion rule (`ModelOptQuantConfigBase.is_layer_excluded`) tries, in order: an exact
match (a fused layer such as `gate_up_proj` matches only when every shard is listed, and only
with a packed-modules mapping, which the drafter's config never has), a plain substring test,
then fnmatch. It matches the runtime's layer names, which the architecture maps from the checkpoint's (repair/arch/),
against the list as vLLM rewrote it for the class it builds: where the class has a weight-name mapper, an entry `X*`
became `X` and `X.*` and every entry was mapped (repair/targets/entry_mappers.py); a layer vLLM fuses from shards is
asked under its fused prefix, in its release's order (repair/targets/fused_exclusions.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Iterable

from repair.errors import BadInput
from repair.formats import nvfp4_packed
from repair.formats.algorithms import MIXED, kv_cache_declared, refusal, single_algo
from repair.formats.base import Covers, Declaration, routed_layer
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, Checkpoint
from repair.io.regex_index import PatternIndex, glob, substring

LEAVES = {"weight": "weight", "weight_scale": "weight_scale", "weight_scale_2": "weight_scale_2", "input_scale": "input_scale",
          "pre_quant_scale": "pre_quant_scale"}  # pre_quant_scale: NVFP4_AWQ's per-input-channel scale
BROKEN_EXPORT = nvfp4_packed.BROKEN_EXPORT


@dataclass(frozen=True)
class ModelOptRule:
    """vLLM's ModelOpt rule over one exclusion list, compiled once: doctor asks it for every module of a
    45k-module checkpoint. Every entry's substring and fnmatch tests are alternatives of one index of RE2 sets
    (io/regex_index.py), so a name costs one pass whatever the list's length."""

    exact: frozenset[str]
    patterns: tuple[str, ...]
    index: PatternIndex  # owner i: patterns[i]'s substring test and fnmatch test
    _experts: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # layer -> an entry contains it

    def excludes(self, prefix: str) -> bool:
        """Asked with a routed expert's name (`...experts.1.gate_proj`), answers for its layer `...experts`: vLLM's
        FusedMoE asks its quant config only with the layer's own name."""
        layer = routed_layer(prefix)
        return layer in self.exact or self.index.matches(layer) or self._expert_entry_contains(layer)

    def _expert_entry_contains(self, layer: str) -> bool:
        """is_layer_skipped's experts branch (exact mode, a layer name holding "experts"): skipped when the name is
        contained in an entry holding "experts", so one expert's entry skips its whole MoE layer."""
        if "experts" not in layer:
            return False
        found = self._experts.get(layer)
        if found is None:
            if "" not in self._experts:  # the entries holding "experts", one per line: one C search per layer
                self._experts[""] = "\n".join(e for e in self.patterns if "experts" in e)
            joined = self._experts[""]
            found = self._experts[layer] = (layer in joined if "\n" not in layer else
                                            any(layer in e for e in self.patterns if "experts" in e))
        return found

    def shard_excluded(self, prefix: str) -> bool:
        """is_layer_skipped's "exact" mode, which ModelOpt's is_layer_excluded uses for fused layers."""
        return prefix in self.exact

    def named(self, test: str, name: str) -> bool:
        """One of is_layer_excluded's tests of one name (the release's `fused_exclusions` orders them for a fused
        layer): "exact" (is_layer_skipped), "pattern" (an entry as a substring of it, or an fnmatch pattern)."""
        return name in self.exact if test == "exact" else self.index.matches(name)

    def used_entries(self, prefixes: Iterable[str]) -> frozenset[str]:
        """The entries that exclude at least one of `prefixes` on their own (the others match no layer)."""
        layers = {routed_layer(p) for p in prefixes}
        return frozenset(self.patterns[i] for i in self.index.used(layers)) | containing(self.patterns, layers)


def containing(entries: Iterable[str], layers: Iterable[str]) -> set[str]:
    """The entries holding "experts" that contain one of the `layers` holding "experts" (is_layer_skipped's experts
    branch), in one pass over the entries: a layer inside an entry puts its first "experts" on one of the entry's, so
    each of those is looked up once per (offset of "experts" in a layer, layer length)."""
    groups: dict[tuple[int, int], set[str]] = {}
    for layer in layers:
        if (at := layer.find("experts")) >= 0:
            groups.setdefault((at, len(layer)), set()).add(layer)
    found = set()
    for e in entries if groups else ():
        at = e.find("experts")
        while at >= 0 and e not in found:
            if any(at >= j and e[at - j:at - j + n] in group for (j, n), group in groups.items()):
                found.add(e)
            at = e.find("experts", at + 1)
    return found


_GLOB_CHARS = frozenset("*?[")  # without them fnmatch is equality, which the substring test already covers


def modelopt_rule(exclusions: Iterable[str]) -> ModelOptRule:
    patterns = tuple(exclusions)
    alternatives = [alt for i, p in enumerate(patterns) for alt in [substring(i, p)] + ([glob(i, p)] if _GLOB_CHARS.intersection(p) else [])]
    return ModelOptRule(frozenset(patterns), patterns, PatternIndex.build(len(patterns), alternatives))


def is_excluded(prefix: str, exclusions: Iterable[str]) -> bool:
    """True when vLLM would build the layer at `prefix` unquantized (for one question: a caller asking about
    many layers keeps a `modelopt_rule`)."""
    return modelopt_rule(exclusions).excludes(prefix)


def read_declaration(ckpt: Checkpoint) -> Declaration:
    """Read both config files' claims, validating the keys this format needs.

    A quantization section without a quant_algo, an algorithm the tool does not read (algorithms.SINGLE_ALGOS
    are: NVFP4, W4A16_NVFP4, NVFP4_AWQ, FP8 per-tensor), or the two files naming different algos is refused:
    repairing on a guess could write a wrong config.
    """
    cfg_path, hf_path = ckpt.root / CONFIG, ckpt.root / HF_QUANT_CONFIG
    quant_cfg = (ckpt.config or {}).get("quantization_config")
    algos: dict[object, object] = {}  # file -> the quant_algo it declares
    ignore = exclude = None
    if quant_cfg is not None:
        if not isinstance(quant_cfg, dict):
            raise BadInput(f"{cfg_path}: quantization_config is not an object; fix the config")
        method = quant_cfg.get("quant_method")
        if method not in (None, "modelopt", "modelopt_fp4"):
            raise BadInput(f"{cfg_path}: quant_method {method!r} is not supported; this tool repairs ModelOpt NVFP4 checkpoints")
        claims, key = config_section(quant_cfg, cfg_path)
        if claims.get("quant_algo") is not None:
            algos[cfg_path] = claims["quant_algo"]
        where = "quantization_config." + ("quantization." if claims is not quant_cfg else "") + key
        ignore = nvfp4_packed.name_list(claims.get(key, []), cfg_path, where)
    if ckpt.hf_quant_config is not None:
        section = ckpt.hf_quant_config.get("quantization")
        if not isinstance(section, dict):
            raise BadInput(f"{hf_path}: missing the 'quantization' object; fix or re-download it")
        if section.get("quant_algo") is not None:
            algos[hf_path] = section["quant_algo"]
        exclude = nvfp4_packed.name_list(section.get("exclude_modules", []), hf_path, "quantization.exclude_modules")
    named = {path: single_algo(algo, path) for path, algo in algos.items()}
    for path, algo in named.items():
        if algo == MIXED:  # the mixed format claims these; reaching here means our own registry is wrong
            raise refusal(path, "quant_algo", algo)
    if len(set(named.values())) > 1:
        raise BadInput(f"{cfg_path} and {hf_path} declare different quant_algo ({named[cfg_path]} and {named[hf_path]}); "
                       "re-download the checkpoint, or make both the algorithm its tensors hold")
    if not algos and (quant_cfg is not None or ckpt.hf_quant_config is not None):
        path, key = (cfg_path, "quantization_config") if quant_cfg is not None else (hf_path, "quantization")
        raise BadInput(f"{path}: {key} has no quant_algo; add \"quant_algo\": \"NVFP4\" if it is an NVFP4 export, or re-download it")
    kv_cache = kv_cache_declared(quant_cfg, (ckpt.hf_quant_config or {}).get("quantization"))
    return Declaration(next(iter(named.values()), None), ignore, exclude, MODELOPT_NVFP4, kv_cache=kv_cache)


def config_section(quant_cfg: dict, where: object = CONFIG) -> tuple[dict, str]:
    """(the object in config.json's quantization_config holding the claims, its exclusion key), as vLLM 0.32's
    ModelOptQuantConfigBase.from_config reads it: ModelOpt's raw `{"producer", "quantization": {...}}` block (what its
    speculative-decoding exporter writes there, the same dict as hf_quant_config.json) holds them in `quantization`,
    under hf_quant_config.json's keys (`exclude_modules`, `kv_cache_quant_algo`); the flat form under `ignore`."""
    if "quantization" not in quant_cfg:
        return quant_cfg, "ignore"
    inner = quant_cfg["quantization"]
    if not isinstance(inner, dict):
        raise BadInput(f"{where}: quantization_config.quantization is not an object, which vLLM refuses; fix the config")
    return inner, "exclude_modules"


def with_exclusions(ckpt: Checkpoint, names: list[str], covers: Covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]:
    """New (config.json, hf_quant_config.json) contents where both exclusion lists cover `names`, and agree.

    `covers(list, name)` tells whether a list already excludes a module (the runtime's matching
    rules); only names a list does not cover are appended to it. Exact entries naming a module
    in `remove` are taken out (it is quantized again). Lists that disagree after that (they did on
    input) become config.json's: vLLM reads it, and `doctor` warns while the two differ.
    """
    return lists_with(copy.deepcopy(ckpt.config), copy.deepcopy(ckpt.hf_quant_config), names, covers, remove)


def lists_with(config: dict | None, hf_quant: dict | None, names: list[str], covers: Covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]:
    """`with_exclusions` on config contents the caller owns (edited in place and returned)."""
    if config is not None and isinstance(config.get("quantization_config"), dict):
        qc, key = config_section(config["quantization_config"])
        qc[key] = nvfp4_packed.append_missing([n for n in qc.get(key) or [] if n not in remove], names, covers)
    if hf_quant is not None:
        section = hf_quant["quantization"]
        section["exclude_modules"] = nvfp4_packed.append_missing([n for n in section.get("exclude_modules") or [] if n not in remove], names, covers)
    lists = exclusion_lists(config, hf_quant)
    if len(lists) == 2 and set(lists[0]) != set(lists[1]):  # they disagreed on input: config.json, which vLLM reads, decides
        hf_quant["quantization"]["exclude_modules"] = list(lists[0])
    return config, hf_quant


def without_entries(config: dict | None, hf_quant: dict | None, entries: frozenset[str]) -> tuple[dict | None, dict | None]:
    """(config.json, hf_quant_config.json) contents with the exclusion entries `entries` (exact strings) taken out of
    both lists: `fix --target` removes the entries that match no module (doctor: unused-exclusion)."""
    config, hf_quant = copy.deepcopy(config), copy.deepcopy(hf_quant)
    if config is not None and isinstance(config.get("quantization_config"), dict):
        outer = config["quantization_config"]
        qc, key = config_section(outer)
        for listed, name in ((qc, key), (outer, "ignore")):  # a nested block's top-level copy too (where SGLang reads it)
            if isinstance(listed.get(name), list):
                listed[name] = [x for x in listed[name] if x not in entries]
    section = hf_quant.get("quantization") if hf_quant is not None else None
    if isinstance(section, dict) and isinstance(section.get("exclude_modules"), list):
        section["exclude_modules"] = [x for x in section["exclude_modules"] if x not in entries]
    return config, hf_quant


def exclusion_lists(config: dict | None, hf_quant: dict | None) -> list[list[str]]:
    """The exclusion lists present in (config.json, hf_quant_config.json) contents."""
    lists = []
    if config is not None and isinstance(config.get("quantization_config"), dict):
        qc, key = config_section(config["quantization_config"])
        lists.append(list(qc.get(key) or []))
    if hf_quant is not None:
        lists.append(list(hf_quant["quantization"].get("exclude_modules") or []))
    return lists


class ModelOptNvfp4(nvfp4_packed.PackedNvfp4):
    """ModelOpt NVFP4, the default format: it also covers plain BF16 checkpoints."""

    NAME = "modelopt-nvfp4"
    GLOBAL_SCALE_IS_DIVISOR = False  # value = fp4 * weight_scale * weight_scale_2
    LEAVES = LEAVES
    RUNTIME_LEAVES = {leaf: role for role, leaf in LEAVES.items() if role != "pre_quant_scale"}  # vLLM's NVFP4 linear
    # vllm/model_executor/layers/quantization/utils/quant_utils.py is_layer_skipped (0.32)
    FUSED_REFUSAL = ("Detected some but not all shards of {prefix} are quantized. All shards of fused layers "
                     "to have the same precision.")
    ENTRY_MAPPING = "modelopt"  # modelopt.py:262-281 apply_vllm_mapper: `X*` split into `X` and `X.*`, then mapped

    def claims(self, ckpt: Checkpoint) -> bool:
        """The default format: any checkpoint no other format claims (plain BF16 ones included)."""
        return True

    def rule(self, exclusions: tuple[str, ...] | list[str], targets: tuple[str, ...] | None) -> ModelOptRule:
        """vLLM's ModelOpt rule (exact, substring, fnmatch); ModelOpt has no config-group targets."""
        return modelopt_rule(exclusions)

    def exclusion_entry(self, module: str) -> str:
        """vLLM's ModelOpt matching takes plain names (substring and fnmatch), so the entry is the name."""
        return module

    read_declaration = staticmethod(read_declaration)
    with_exclusions = staticmethod(with_exclusions)
    exclusion_lists = staticmethod(exclusion_lists)
    without_entries = staticmethod(without_entries)


MODELOPT_NVFP4 = ModelOptNvfp4()
