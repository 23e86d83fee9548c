"""compressed-tensors' `nvfp4-pack-quantized` checkpoint format.

Tensors per quantized Linear: `weight_packed` uint8 [out, in/2] (ModelOpt's nibble order),
`weight_scale` float8_e4m3fn [out, in/16], `weight_global_scale` float32 = 1 / ModelOpt's
`weight_scale_2` (a divisor: value = fp4 * weight_scale / weight_global_scale) and optional
`input_global_scale` = 1 / `input_scale`. The only declaration is config.json's
`quantization_config` (`quant_method: compressed-tensors`): its `ignore` list takes exact vLLM
layer names or `re:` patterns, and its config groups' `targets` say what is quantized.

vLLM's exclusion rule (`should_ignore_layer`, `check_equal_or_regex_match`) is stricter than
ModelOpt's: an entry excludes a layer only when it equals the name or is `re:REGEX` with
`re.match` (anchored at the start), so `pre_projection` does not exclude
`draft_model.pre_projection`. A layer no config-group target names is not quantized either
(`Linear` targets every linear layer).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Iterable

from repair.errors import BadInput
from repair.formats import ct_groups, nvfp4_packed
from repair.formats.algorithms import kv_cache_declared
from repair.formats.base import Covers, Declaration
from repair.io.checkpoint import CONFIG, Checkpoint
from repair.io.patterns import MATCH, RegexSet
from repair.io.regex_index import used_patterns
from repair.formats.modules import split_name

NAME = "compressed-tensors"
PACKED_FORMAT = "nvfp4-pack-quantized"
LEAVES = {"weight": "weight_packed", "weight_scale": "weight_scale", "weight_scale_2": "weight_global_scale", "input_scale": "input_global_scale"}
UNSUPPORTED = {
    "requantize": "requantizing writes ModelOpt's quantizer output, which is not byte-identical to compressed-tensors'; dequantize instead",
    "original": "--original verifies the original by requantizing with ModelOpt's math, which compressed-tensors' quantizer does not match; "
                "dequantize without --original",
    "tp": "--tp reshards ModelOpt names only; reshard after converting, or run without --tp",
}


@dataclass(frozen=True)
class Entries:
    """An ignore or targets list compiled once: names equal to an entry, and `re:` entries under re.match."""

    exact: frozenset[str]
    regexes: RegexSet
    listed: tuple[str, ...] = ()  # the entries as given

    def matches(self, prefix: str) -> bool:
        return prefix in self.exact or self.regexes.matches(prefix)

    def used(self, prefixes: Iterable[str]) -> frozenset[str]:
        """The entries matching at least one of `prefixes`: one pass over them."""
        prefixes = list(prefixes)
        matched = used_patterns(self.regexes, prefixes)
        return frozenset(self.exact.intersection(prefixes)) | {e for e in self.listed if e.startswith("re:") and e[3:] in matched}


def entries(listed: Iterable[str], where: object = "compressed-tensors ignore/targets entry") -> Entries:
    listed = tuple(listed)
    return Entries(frozenset(e for e in listed if not e.startswith("re:")),
                   RegexSet.compile([e[3:] for e in listed if e.startswith("re:")], MATCH, where), listed)


@dataclass(frozen=True)
class CtRule:
    """vLLM's compressed-tensors rule over one ignore list and the config groups' targets, compiled once."""

    ignore: Entries
    targets: Entries | None  # None: `Linear` is a target, so every linear layer is

    def excludes(self, prefix: str) -> bool:
        """An ignore entry matches, or no config-group target names the layer."""
        return self.ignore.matches(prefix) or self.untargeted(prefix)

    def shard_excluded(self, prefix: str) -> bool:
        """find_matching_patterns: an ignore entry equal to the shard's name or `re:` matching it."""
        return self.ignore.matches(prefix)

    def named(self, test: str, name: str) -> bool:
        """One of should_ignore_layer's tests of one name: "exact" (equal), "pattern" (a `re:` entry, re.match)."""
        return name in self.ignore.exact if test == "exact" else self.ignore.regexes.matches(name)

    def untargeted(self, prefix: str) -> bool:
        """No config-group target names the layer (find_matched_target finds none): it is built unquantized."""
        return self.targets is not None and not self.targets.matches(prefix)

    def used_entries(self, prefixes: Iterable[str]) -> frozenset[str]:
        """The ignore entries that exclude at least one of `prefixes` on their own: where a layer is one no target
        names, every entry does (the rule over any list excludes it)."""
        prefixes = list(prefixes)
        if self.targets is not None and not all(self.targets.matches(p) for p in prefixes):
            return frozenset(self.ignore.listed)
        return self.ignore.used(prefixes)


def ct_rule(ignore: Iterable[str], targets: Iterable[str] | None = None) -> CtRule:
    listed = list(targets) if targets is not None else ["Linear"]
    return CtRule(entries(ignore), None if "Linear" in listed else entries(listed))


def ct_is_excluded(prefix: str, ignore: Iterable[str], targets: Iterable[str] | None = None) -> bool:
    """True when vLLM's compressed-tensors config builds the layer at `prefix` unquantized (compiles the lists:
    for one question; a caller asking about many layers keeps a `ct_rule`)."""
    return ct_rule(ignore, targets).excludes(prefix)


def ct_entry_matches(prefix: str, entry: str) -> bool:
    """compressed-tensors' rule for one ignore or target entry: equal, or `re:` + re.match."""
    return entries([entry]).matches(prefix)


def read_declaration(ckpt: Checkpoint) -> Declaration:
    """config.json's quantization_config: config groups of NVFP4 (and, beside them, FP8) schemes; other formats refused.

    Groups with one scheme declare it for every targeted layer; groups with different schemes (RedHatAI's
    DeepSeek-V4-Flash: FP8 block attention, NVFP4 experts) declare MIXED_GROUPS, and each layer takes the scheme of
    the first target matching it (formats/ct_groups.py, as vLLM's and SGLang's CompressedTensorsConfig do)."""
    path = ckpt.root / CONFIG
    quant_cfg = (ckpt.config or {}).get("quantization_config")
    if quant_cfg is None:
        return Declaration(None, None, None, COMPRESSED_TENSORS)
    if not isinstance(quant_cfg, dict):
        raise BadInput(f"{path}: quantization_config is not an object; fix the config")
    groups = quant_cfg.get("config_groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise BadInput(f"{path}: quantization_config.config_groups must be an object of objects; fix the config")
    targets: list[str] = []
    for name, group in groups.items():
        targets += nvfp4_packed.name_list(group.get("targets", []), path, f"quantization_config.config_groups.{name}.targets")
    ignore = nvfp4_packed.name_list(quant_cfg.get("ignore", []), path, "quantization_config.ignore")
    where = f"{path}: quantization_config entry"
    entries((*ignore, *targets), where)  # a broken or hanging `re:` entry is refused here
    algos = {name: ct_groups.group_algorithm(g, quant_cfg.get("format"), f"{path}: quantization_config.config_groups.{name}")
             for name, g in groups.items()} if len(_schemes(groups)) > 1 else None
    mixed = algos is not None and len(set(algos.values())) > 1
    if not mixed:  # one scheme, however many groups spell it: read when it is NVFP4 packing, as before
        _single_format(quant_cfg, groups, path)
    algo = ct_groups.MIXED_GROUPS if mixed else scheme_algo(groups)
    return Declaration(algo, ignore, None, COMPRESSED_TENSORS, tuple(targets) if groups else None,
                       kv_cache=kv_cache_declared(quant_cfg, None),
                       group_algos=ct_groups.GroupSchemes.from_groups(groups, algos, where, quant_cfg.get("format")) if mixed else None,
                       sparsity=_sparsity(quant_cfg.get("sparsity_config"), path))


def _sparsity(config: object, path: object) -> ct_groups.Sparsity | None:
    """quantization_config.sparsity_config (any falsy value: none, as the runtimes' `if not (...)` reads it), its fields
    as compressed-tensors' SparsityCompressionConfig validates them, its targets compiled as config-group targets are."""
    if not config:
        return None
    key = "quantization_config.sparsity_config"
    if not isinstance(config, dict):
        raise BadInput(f"{path}: {key} is not an object; fix the config")
    for field, required in (("format", True), ("sparsity_structure", False)):
        if not isinstance(config.get(field), str) and (required or config.get(field) is not None):
            raise BadInput(f"{path}: {key}.{field} is not a string (the runtimes' SparsityCompressionConfig refuses "
                           f"the config); fix the config")
    ignored = set(nvfp4_packed.name_list(config.get("ignore"), path, f"{key}.ignore"))
    written = nvfp4_packed.name_list(config.get("targets"), path, f"{key}.targets")
    targets = [t for t in written if t not in ignored]
    structure, fmt = config.get("sparsity_structure"), config["format"]
    names, cls = entries(targets, f"{path}: {key} entry"), ct_groups.LINEAR_CLASS
    by_class = names.matches(cls) or any(t.lower() in cls.lower() for t in names.exact)
    return ct_groups.Sparsity(structure, fmt, names, by_class, bool(written))


def _single_format(quant_cfg: dict, groups: dict, path: object) -> None:
    """Groups of one scheme: this tool reads them when that scheme is NVFP4 packing."""
    formats = {quant_cfg.get("format")} | {g.get("format") for g in groups.values()}
    formats.discard(None)
    if formats != {PACKED_FORMAT}:
        found = ", ".join(sorted(str(f) for f in formats)) or "none"
        raise BadInput(f"{path}: compressed-tensors format {found} is not supported; this tool repairs {PACKED_FORMAT} (NVFP4) checkpoints")


def scheme_algo(groups: dict) -> str:
    """The ModelOpt name of the config groups' one scheme, by its real fields: `input_activations` null or absent is
    weights-only NVFP4 (NVFP4A16, as llm-compressor writes it), for which vLLM 0.32 picks
    CompressedTensorsW4A4Fp4(use_a16=True) and registers no input_global_scale (W4A16_NVFP4); else W4A4 (NVFP4)."""
    weight_only = bool(groups) and all(not g.get("input_activations") for g in groups.values())
    return "W4A16_NVFP4" if weight_only else "NVFP4"


def _schemes(groups: dict) -> set[str]:
    """The groups' distinct schemes (every field but the targets)."""
    return {json.dumps({k: v for k, v in g.items() if k != "targets"}, sort_keys=True, default=str) for g in groups.values()}


def exclusion_entry(module: str) -> str:
    """An `ignore` entry that matches the module under vLLM's names and transformers' alike.

    vLLM names a Gemma 4 drafter's layers `draft_model.layers.N...` and fuses gate/up into
    `gate_up_proj`; transformers keeps the checkpoint's names. Both end the same way, so the
    entry is a `re:` pattern on the name without its leading `model.`, at a dot boundary.
    """
    base = module[len("model."):] if module.startswith("model.") else module
    fused = ".mlp.gate_up_proj"
    if base.endswith(fused):
        stem = re.escape(base[: -len("gate_up_proj")])
        return f"re:(.*\\.)?{stem}(gate_up_proj|gate_proj|up_proj)$"
    return f"re:(.*\\.)?{re.escape(base)}$"


def with_exclusions(ckpt: Checkpoint, names: list[str], covers: Covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]:
    """New (config.json, hf_quant_config.json) contents whose `ignore` covers `names`.

    Only config.json is compressed-tensors' declaration; a leftover hf_quant_config.json (the
    converter copies ModelOpt's) is returned unchanged. Entries equal to a module in `remove`,
    or to its pattern, are taken out.
    """
    config = copy.deepcopy(ckpt.config)
    if config is not None and isinstance(config.get("quantization_config"), dict):
        qc = config["quantization_config"]
        dropped = set(remove) | {exclusion_entry(n) for n in remove}
        existing = [e for e in qc.get("ignore") or [] if e not in dropped]
        qc["ignore"] = existing + [exclusion_entry(n) for n in names if not covers(existing, n)]
    return config, ckpt.hf_quant_config


def without_entries(config: dict | None, hf_quant: dict | None, entries: frozenset[str]) -> tuple[dict | None, dict | None]:
    """config.json contents with the `ignore` entries `entries` (exact strings) taken out (see modelopt_nvfp4)."""
    config = copy.deepcopy(config)
    qc = config.get("quantization_config") if config is not None else None
    if isinstance(qc, dict) and isinstance(qc.get("ignore"), list):
        qc["ignore"] = [x for x in qc["ignore"] if x not in entries]
    return config, hf_quant


def exclusion_lists(config: dict | None, hf_quant: dict | None) -> list[list[str]]:
    """The exclusion list present in config.json contents (the only one compressed-tensors reads)."""
    if config is not None and isinstance(config.get("quantization_config"), dict):
        return [list(config["quantization_config"].get("ignore") or [])]
    return []


class CompressedTensors(nvfp4_packed.PackedNvfp4):
    """compressed-tensors `nvfp4-pack-quantized`: global scales divide, and only config.json declares."""

    NAME = NAME
    GLOBAL_SCALE_IS_DIVISOR = True
    LEAVES = LEAVES
    RUNTIME_LEAVES = {leaf: role for role, leaf in LEAVES.items()}
    UNSUPPORTED = UNSUPPORTED
    # vllm/model_executor/layers/quantization/compressed_tensors/utils.py should_ignore_layer (0.32)
    FUSED_REFUSAL = "Found different quantization schemes for the shards of {prefix}. vLLM requires all to use the same scheme."
    ENTRY_MAPPING = "paths"  # compressed_tensors.py:129-158 apply_vllm_mapper: entries with a `.`, not `re:`, mapped

    def claims(self, ckpt: Checkpoint) -> bool:
        """config.json says compressed-tensors, or (no quantization config) the tensors are named `weight_packed`."""
        quant_cfg = (ckpt.config or {}).get("quantization_config")
        if isinstance(quant_cfg, dict):
            return quant_cfg.get("quant_method") == NAME
        return ckpt.hf_quant_config is None and any(split_name(t.name)[1] == LEAVES["weight"] for s in ckpt.shards for t in s.tensors)

    def rule(self, exclusions: tuple[str, ...] | list[str], targets: tuple[str, ...] | None) -> CtRule:
        """vLLM's compressed-tensors rule: an ignore entry matches, or no config-group target names the layer."""
        return ct_rule(exclusions, targets)

    read_declaration = staticmethod(read_declaration)
    exclusion_entry = staticmethod(exclusion_entry)
    with_exclusions = staticmethod(with_exclusions)
    exclusion_lists = staticmethod(exclusion_lists)
    without_entries = staticmethod(without_entries)


COMPRESSED_TENSORS = CompressedTensors()
