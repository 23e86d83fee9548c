"""Architecture rows generated from a runtime release's own model code (repair/targets/data/<runtime>-<release>.json).

tools/vllm_profile.py builds every architecture vLLM registers on the meta device with a quantization config
that quantizes everything it can, and records per vLLM module-name pattern (layer numbers as `*`) whether the
layer got a quantized method, an unquantized one, or none (built without the quant config), the class's fused
layers (packed_modules_mapping) and what its weight-name mapper does to checkpoint names. A data file is one
runtime release; another runtime's release (SGLang, TensorRT-LLM) is one more file of the same form. Here each
profiled architecture becomes an `Architecture` row: its never-quantized layers are `UnquantizedRole`s matched on
checkpoint names, its fused layers are `fused_layers`, and where the layer a checkpoint module loads into hands
vLLM's quant config another prefix than the module's name (`prefixes`: GraniteMoe's 3-D `input_linear` loads into
the FusedMoE layer `experts`; Afmoe builds lm_head with the prefix ""), exclusions are matched on that prefix.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from importlib.resources import files

from repair.arch.base import Architecture, DroppedTensor, RefusedConfig, RefusedLoad
from repair.arch.borrowed import borrowed_entry
from repair.arch.configured import as_configured, disagreement
from repair.arch.layer_rules import layer_drops
from repair.arch.load_refusals import refused_loads
from repair.arch.registry import Registry
from repair.arch.roles import GENERIC_ROLES, UnquantizedRole

DATA = files("repair") / "targets" / "data"
NEVER_QUANTIZED = ("none", "unquantized")  # the quant config was never asked, or declined, under quantize-everything
NVFP4_ONLY = {"formats": ("modelopt-nvfp4",), "quant_algos": ("NVFP4", "W4A16_NVFP4", "NVFP4_AWQ")}  # vLLM's modelopt_fp4
NUMBER = re.compile(r"\.\d+(?=\.|$)")
STAR = re.compile(r"\.\*(?=\.|$)")
PLACED = re.compile(r"\{(\d{1,3})\}")
# what the profiled runtime's own model code does with names, not which layers it builds: the prefix a layer hands its
# quant config (Afmoe's lm_head: "" in vLLM 0.32, "lm_head" in SGLang 0.5.23's afmoe.py), what load_weights refuses or drops
OWN_CODE = frozenset({"prefixes", "nvfp4_load_refused", "dropped", "load_refused", "loads_only_with", "refused_only_with",
                      "config_refused", "exclusion_mappers", "weight_refused", "tensors_refused"})
# but 3-D experts (GraniteMoe's input_linear, Llama4's experts.gate_up_proj) load into the routed experts' FusedMoE, which
# each runtime's model asks about under its `experts` module: SGLang 0.5.23 granitemoe.py:142-151, llama4.py:120-129
ROUTED_EXPERTS = ".experts"


@dataclass(frozen=True)
class AskedPrefixes:
    """Checkpoint module -> the prefix vLLM's quant config is asked about for the layer the module loads into (the
    profile's `prefixes`, name patterns with `*` for layer numbers, a trailing number kept where siblings differ:
    Zamba2's adapter `.0` / `.1`); any other module is its own prefix. A prefix's `*` takes the module's numbers in
    order, `{i}` its i-th one (Zamba2's `model.feed_forward.gate_up_proj_adapter_list.{1}.A`: the adapter index).
    `writable`: as the name an exclusion entry uses: the prefix where an entry can name it (not "") and the checkpoint
    name does not already reach it (ModelOpt's rule tests entries as substrings: `lm_head` reaches ".lm_head")."""

    prefixes: tuple[tuple[str, str], ...]
    writable: bool = False

    @cached_property
    def table(self) -> dict[str, str]:
        return dict(self.prefixes)

    def __call__(self, module: str) -> str:
        target = self.table.get(name_key(self.table, module))
        if target is None or (self.writable and (not target or module in target)):
            return module  # as an entry: the checkpoint name, where vLLM's substring test already reaches the prefix
        numbers = [n[1:] for n in NUMBER.findall(module)]
        if PLACED.search(target):  # `{i}`: the name's i-th number (Zamba2's adapter index, not its layer number)
            return PLACED.sub(lambda m: numbers[int(m.group(1))] if int(m.group(1)) < len(numbers) else m.group(0), target)
        taken = iter(numbers)
        return STAR.sub(lambda _: "." + next(taken, "*"), target)


def name_key(table: dict, module: str) -> str | None:
    """The key of `table` (checkpoint name patterns, layer numbers `*`) a module matches, None if none: the pattern
    with the last number as written first (a module named by a number, nn.Sequential's, recorded so where its
    siblings differ: Zamba2's adapter `.0` and `.1`), else every number `*`."""
    parent, _, leaf = module.rpartition(".")
    kept = f"{NUMBER.sub('.*', parent)}.{leaf}"
    if leaf.isdigit() and kept in table:
        return kept
    star = NUMBER.sub(".*", module)
    return star if star in table else None


@dataclass(frozen=True)
class ReleaseProfile:
    """One runtime release's profile file, as read: its rows and what it could not profile (and why)."""

    runtime: str
    release: tuple[int, ...]
    source: str  # the file's name, which messages cite
    entries: dict  # architecture -> {"modules", "fused", "renames", "config"}
    unprofiled: dict  # architecture -> why not
    missing_weights: dict = field(default_factory=dict)  # what its loader does with unfilled weights (vllm_missing_weights.py)
    null_exclusions_refused: dict = field(default_factory=dict)  # quant method -> its config reader's error on a null list
    load_checked: bool = False  # every row records whether the release loads any checkpoint of it (`load_refused`)
    registry: Registry | None = None  # which listed name of a config it builds (arch/registry.py); None: not recorded
    build_refused: dict = field(default_factory=dict)  # architecture -> {"error", "raised_at"}: its own code refuses it
    experts_gate_up_scale_2: dict = field(default_factory=dict)  # quant method -> a routed gate/up's kept global scale
    modelopt_nested_refused: dict = field(default_factory=dict)  # quant_algo -> its config reading's error (nested form)
    fused_exclusions: dict = field(default_factory=dict)  # config kind -> how it tests a fused layer (targets/fused_exclusions.py)
    ct_sparsity_refused: dict = field(default_factory=dict)  # its config reading's error on sparsity targets (vllm_ct_sparsity.py)
    modelopt_mixed_keys: dict = field(default_factory=dict)  # how it maps quantized_layers keys (vllm_mixed_keys.py); {}: not

    @property
    def label(self) -> str:
        return f"{self.runtime} {'.'.join(map(str, self.release))}"

    def row(self, name: str, borrowed: bool = False, config: dict | None = None) -> Architecture | None:
        """The architecture's row; `borrowed`: for another runtime whose rules take its layer roles and fused layers, without
        what only this runtime's code says (`OWN_CODE`, borrowed.py) but the routed experts' prefix. `config`: a config
        lacking the fields the profiled build read (`without`) takes the modules vLLM builds then."""
        if disagreement(self.entries.get(name), config):  # a learned row of another branch: `arch.architecture` says so
            return None
        entry = as_configured(self.entries.get(name), config)
        if entry is not None and borrowed:
            entry = borrowed_entry(entry, OWN_CODE, ROUTED_EXPERTS)
        return None if entry is None else generated_row(self, name, entry)


def release_of(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def read_profiles() -> tuple[ReleaseProfile, ...]:
    """Every shipped profile file, oldest release first (per runtime)."""
    out = []
    for item in DATA.iterdir():
        if not item.name.endswith(".json"):
            continue
        doc = json.loads(item.read_text(encoding="utf-8"))
        if "architectures" not in doc:
            continue  # a rules-only release file (repair/targets/runtime_rules.py reads it)
        release = release_of(doc["release"])
        label, facts = f"{doc['runtime']} {'.'.join(map(str, release))}", ("modelopt_nested_refused", "fused_exclusions",
                                                                          "ct_sparsity_refused", "modelopt_mixed_keys")
        out.append(ReleaseProfile(doc["runtime"], release, item.name, doc["architectures"], doc["unprofiled"],
                                  doc.get("missing_weights", {}), doc.get("null_exclusions_refused", {}),
                                  doc.get("load_refused_checked") is True, Registry.read(doc, label, item.name),
                                  doc.get("build_refused", {}), doc.get("experts_gate_up_scale_2", {}),
                                  *(doc.get(k, {}) for k in facts)))
    return tuple(sorted(out, key=lambda p: (p.runtime, p.release)))


def pattern_regex(patterns: list[str]) -> str:
    """A regex (re.search) matching checkpoint module names of these name patterns (`*` = a layer number)."""
    return "|".join("^" + re.escape(p).replace(re.escape("*"), r"\d+") + "$" for p in sorted(patterns))


def never_quantized_roles(profile: ReleaseProfile, entry: dict) -> tuple[UnquantizedRole, ...]:
    """One role per layer class the release builds without a quantized method, matched on checkpoint names: the
    vLLM pattern itself and every checkpoint pattern its weight mapper renames to it. A layer the NVFP4 config
    declined that the same code quantizes under compressed-tensors' config (`modelopt_fp4_only`, generated, of the
    main model or its MTP drafter: Qwen4Exp's QSA qkv_proj, Qwen3.5's mtp.fc) holds under ModelOpt's NVFP4 only."""
    by_layer: dict[tuple[str, bool], list[str]] = {}
    modules, renames = with_drafter(entry)
    drafter = entry.get("mtp", {})
    modelopt_only = {*entry.get("modelopt_fp4_only", ()),
                     *(p for p in drafter.get("modelopt_fp4_only", ()) if p not in entry["modules"])}
    for vllm_pattern, module in modules.items():
        # generic only where every checkpoint name of it is too (Mistral Large 3's `tok_embeddings` is `embed_tokens`)
        named = [vllm_pattern, *(ckpt for ckpt, mapped in renames.items() if mapped == vllm_pattern)]
        if module["state"] in NEVER_QUANTIZED and not all(_generic(p) for p in named):
            nvfp4_only = module["state"] == "unquantized" and vllm_pattern in modelopt_only
            by_layer.setdefault((module["layer"], nvfp4_only), []).append(vllm_pattern)
    roles = []
    for (layer, nvfp4_only), patterns in sorted(by_layer.items()):
        shards = fused_shards(entry, patterns)  # and their checkpoint names (DeepSeek-V4's `layers.*.attn.compressor.wkv`)
        names = patterns + shards + [ckpt for ckpt, mapped in renames.items() if mapped in patterns or mapped in shards]
        roles.append(UnquantizedRole(f"{layer} layer", pattern_regex(names),
                                     f"{profile.label} builds {', '.join(sorted(patterns))} as {layer} without a "
                                     f"quantized method (its model code, recorded in {profile.source})",
                                     **(NVFP4_ONLY if nvfp4_only else {})))
    return tuple(roles)


def fused_shards(entry: dict, patterns: list[str]) -> list[str]:
    """The checkpoint names of the shards of every fused layer among `patterns`: a layer built unquantized is
    unquantized in each shard it loads (Qwen4Exp's QSA q/k/v/indexer linear: `self_attn.q_proj`, ...)."""
    fused = entry.get("fused", {})
    return [f"{parent}.{shard}" for parent, _, leaf in (p.rpartition(".") for p in patterns) for shard in fused.get(leaf, ())]


def with_drafter(entry: dict) -> tuple[dict, dict]:
    """(modules, renames) of the main model plus its MTP drafter's (the `mtp` block: DeepSeekMTP's eh_proj, Qwen3.5's
    mtp.fc); where both name a pattern, the main model's entry stands. Renames: the weight mapper's, and where the
    class's load_weights puts a module under another name in code (`loads_into`: HYV3's `mlp.router.gate` -> `mlp.gate`)."""
    drafter = entry.get("mtp", {})
    return ({**drafter.get("modules", {}), **entry["modules"]},
            {**drafter.get("renames", {}), **entry.get("loads_into", {}), **entry.get("renames", {})})


def _generic(vllm_pattern: str) -> bool:
    """A pattern a generic role (embedding, norm) already covers under every format: no role of its own (doctor asks
    every role of every module, so each one costs)."""
    example = vllm_pattern.replace("*", "0")
    return any(not r.formats and not r.quant_algos and re.search(r.pattern, example) for r in GENERIC_ROLES)


def generated_row(profile: ReleaseProfile, name: str, entry: dict) -> Architecture:
    """The row of one profiled architecture: generic roles plus the release's never-quantized layers; its fused layers."""
    fused = {k: tuple(v) for k, v in entry.get("fused", {}).items()}
    prefixes = tuple(sorted(entry.get("prefixes", {}).items()))
    names = {"runtime_name": AskedPrefixes(prefixes), "exclusion_name": AskedPrefixes(prefixes, writable=True)} if prefixes else {}
    refused = tuple((pattern_regex([p]), f"{profile.label}'s {name} load_weights fails on ModelOpt's NVFP4 tensors of it "
                                         f"({why}; its own code, recorded in {profile.source})")
                    for p, why in sorted(entry.get("nvfp4_load_refused", {}).items()))
    dropped = tuple(DroppedTensor(pattern_regex([p]), fact["unfilled"], fact["refused"],
                                  f"{profile.label}'s {name} load_weights fills no parameter with it (its own code, "
                                  f"recorded in {profile.source})") for p, fact in sorted(entry.get("dropped", {}).items()))
    unread = tuple((p, f"{profile.label}'s {name} drops every tensor under {p} unread (its weight mapper or its "
                       f"loader's skip_prefixes: its own code, recorded in {profile.source})") for p, new in sorted(entry.get("renames", {}).items())
                   if new is None and p.endswith("."))
    drops = tuple(drop for module, rule in sorted(entry.get("dropped_in_layers", {}).items())
                  for drop in layer_drops(module, rule, profile.source))
    fields = " / ".join(entry.get("without", {}).get("fields", ())[:1])
    required = tuple((p, f"{profile.label} builds {name} with it where config.json sets {fields}, as this one does, and "
                         f"its load_weights fills a parameter from it (recorded in {profile.source})")
                     for p in entry.get("loads_only_with", ()))
    load = entry.get("load_refused")
    load_refused = RefusedLoad(load, profile.label, profile.source) if isinstance(load, str) and load else None
    said = entry.get("config_refused")
    config = RefusedConfig(tuple(said["fields"]), said["problem"], said["remedy"], said["error"], profile.label,
                           profile.source) if said else None
    refused_modules = refused_loads(profile.label, profile.source, name, entry, fields, load_refused is not None)
    return Architecture(f"{name} ({profile.label} profile)", architectures=(name,),
                        unquantized_roles=(*GENERIC_ROLES, *never_quantized_roles(profile, entry)), fused_layers=fused,
                        merged_layers=merged_layers(entry),
                        nvfp4_load_refused=refused, dropped_tensors=dropped, dropped_in_layers=drops, unread_prefixes=unread,
                        load_refused=load_refused, built_quantized=BuiltQuantized(entry), required_modules=required,
                        refused_modules=refused_modules, refused_config=config,
                        **names)


def merged_layers(entry: dict) -> dict[str, tuple[str, ...]]:
    """Layers the release's loader fills from 2+ checkpoint modules of one parent, from the profile's renames (what its
    load_weights placed where): StableLM's and GPT-J's q/k/v -> qkv_proj, built with no packed_modules_mapping."""
    into: dict[str, list[str]] = {}
    for module, target in with_drafter(entry)[1].items():
        if isinstance(module, str) and isinstance(target, str) and module.rpartition(".")[0] == target.rpartition(".")[0]:
            into.setdefault(target, []).append(module.rpartition(".")[2])
    return {t.rpartition(".")[2]: tuple(sorted(leaves)) for t, leaves in sorted(into.items()) if len(leaves) > 1}


@dataclass(frozen=True)
class BuiltQuantized:
    """Whether the release builds a layer (a checkpoint module, or a fused layer by its own name) with a quantized
    method when nothing is excluded, in every layer of its pattern: its quant config was asked about it. A value
    holding the profile entry, so rows compare by their facts (a closure would make equal rows unequal)."""

    entry: dict

    def __call__(self, module: str) -> bool:
        return module_state(self.entry, module) == "quantized"


def releases_loading(profiles: tuple[ReleaseProfile, ...], runtime: str, name: str) -> tuple[str, ...]:
    """The shipped releases of `runtime` whose profile checked and records no refusal to load architecture `name`."""
    return tuple(p.label for p in profiles if p.runtime == runtime and p.load_checked and name in p.entries
                 and not p.entries[name].get("load_refused"))


def load_refusal_holds(profiles: tuple[ReleaseProfile, ...], runtime: str, version: tuple[int, ...] | None, name: str) -> bool:
    """Whether a profiled release of `runtime` at or after `version` (None: the newest) records that it loads no
    checkpoint of architecture `name` (a loader fixed in some release stays fixed: `refusal_holds`)."""
    return refusal_holds(profiles, runtime, version, lambda p: p.load_checked and p.entries.get(name, {}).get("load_refused"))


def refusal_holds(profiles: tuple[ReleaseProfile, ...], runtime: str, version: tuple[int, ...] | None,
                  refuses: Callable[[ReleaseProfile], object]) -> bool:
    """Whether a profiled release of `runtime` at or after `version` (None: the newest) `refuses` (load or build): a
    model's code fixed in some release stays fixed, so such a refusal holds for the asked release; one recorded only
    by an older release may have been fixed since."""
    ours = [p for p in profiles if p.runtime == runtime]
    since = version if version is not None else max((p.release for p in ours), default=())
    return any(p.release >= since and refuses(p) for p in ours)


def module_state(entry: dict, module: str) -> str | None:
    """What the release builds a checkpoint module as ("quantized", "unquantized", "none"), None when not recorded:
    the module's pattern, renamed by the weight mapper, else folded into its fused layer."""
    modules, renames = with_drafter(entry)
    found = renames.get(name_key(renames, module), NUMBER.sub(".*", module))
    if found is None:
        return None
    parent, _, leaf = found.rpartition(".")
    fused = next((f for f, shards in entry.get("fused", {}).items() if leaf in shards), None)
    candidates = (found, f"{parent}.{fused}" if fused else found)
    return next((modules[c]["state"] for c in candidates if c in modules), None)
