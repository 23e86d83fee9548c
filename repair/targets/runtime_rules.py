"""A runtime release's rules as data: repair/targets/data/<runtime>-<release>.json with a `rules` block.

The block names the matcher per config kind (repair/targets/matchers.py), the fused-layer policy and its error, the
unknown-tensor policy, the loader behaviours, the draft/MTP rules, error templates, the algorithms the release
refuses while reading the config, and the model classes' packed_modules_mapping; `source` says where each fact was
read (wheel or repo, path, version). docs/runtime_profiles.md documents the form. Doctor and planning code ask these
values, never which runtime it is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from importlib.resources import files
from types import MappingProxyType
from typing import Mapping

from repair.arch.layer_rules import LayerDrop, layer_drops
from repair.arch.registry import Backend, Registry
from repair.arch.resolved import FirstListed
from repair.errors import BadInput
from repair.formats.base import Declaration
from repair.targets.config_lists import flat_exclusions, list_sources, source_named
from repair.targets.matchers import KINDS, READING_REFUSALS, UNREAD_ENTRIES, exclusion_matcher, layer_matcher
from repair.targets.rule_wrappers import DraftBf16, MtpLayers, UnreadList
from repair.targets.sglang_match import Building, CtTargets

DATA = files("repair") / "targets" / "data"
LLAMA_FUSIONS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


# checkpoint format (Format.NAME) -> the config kind a rules file's `matchers` describe it under
CONFIG_KINDS = {"compressed-tensors": "compressed-tensors", "modelopt-nvfp4": "modelopt", "modelopt-mixed": "modelopt",
                "deepseek_v4_fp8": "deepseek_v4_fp8"}


@dataclass(frozen=True)
class RuntimeRules:
    """One release's `rules` block, as read (see the module docstring)."""

    runtime: str
    release: tuple[int, ...]
    source: str  # the data file's name
    display: str  # how messages name the runtime ("SGLang")
    matchers: Mapping[str, str]
    follows_draft_config: bool
    layer_rows: str  # the target spec whose generated architecture rows (layer roles, fusions) apply
    fused: Mapping[str, str]
    unknown_tensors: Mapping[str, str]
    loaders: Mapping[str, Mapping[str, str]]
    draft: Mapping
    errors: Mapping[str, str]
    refused_algorithms: Mapping[str, str]
    fallback_fused: bool
    packed: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    fusion_names: Mapping[str, str] = field(default_factory=dict)  # layer rows' fused name -> this runtime's
    layer_classes: Mapping[str, str] = field(default_factory=dict)  # layer rows' class -> loader family in `loaders`
    row_parallel_leaves: tuple[str, ...] = ()  # leaves loaded row-parallel where no layer row says
    packed_when: Mapping[str, Mapping[str, Mapping[str, tuple[str, ...]]]] = field(default_factory=dict)  # arch ->
    # {config key: the mapping its model class's __init__ adds when the key is set} (DeepSeek's q_lora_rank)
    stacked_unchecked: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # arch -> stacked names whose
    # load_weights branch indexes params_dict unchecked: a stored tensor the built layer lacks is a KeyError

    nested_drops: tuple[str, ...] = ()  # quant methods whose exclusions in config.json's nested form are dropped
    plain_layers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # arch -> layers built plain nn.Linear
    ct_target_order: tuple[str, ...] = ()  # find_matched_target's passes (formats/ct_groups.ORDERS); () as vLLM's
    built_layers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # arch -> {the runtime's own layer
    # prefix (`*` = layer number): class} its constructor asks the quant config about (tools/sglang_built_layers.py)
    layer_names: Mapping[str, Mapping[str, str]] = field(default_factory=dict)  # arch -> {checkpoint module pattern:
    # the name its exclusion rules ask for the layer it loads into, where they differ} (tools/sglang_layer_names.py)
    null_exclusions_refused: Mapping[str, str] = field(default_factory=dict)  # quant method -> the error reading the
    # config raises when the exclusion list it reads is null (`null_exclusion_list`)
    own_layers: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # arch -> module suffixes its model builds
    # as their own layer though the layer rows' leaf fusion names them a shard (Afmoe's attention `gate_proj`)
    model_fusions: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)  # arch -> {fused leaf:
    # shards} its model builds where the layer rows' runtime builds separate layers (TensorRT-LLM's Laguna GatedMLP)
    missing_weights: Mapping[str, str] = field(default_factory=dict)  # {"linear", "norm"} -> "refused" | "unchecked":
    # what its loader does with a weight the checkpoint does not store (probed; {} where not known)
    registry: frozenset[str] = frozenset()  # every name its model registry has (the wheel's EntryClass); empty: unknown
    backend: Backend | None = None  # its Transformers backend's gate on other names (tools/sglang_backend.py); None: unknown
    registry_rule: FirstListed | None = None  # it asks only the first listed name (tools/trtllm_registry.py); None: unknown
    # quant method -> which global scale its NVFP4 MoE keeps for a routed expert's gate/up (doctor/expert_scales.py)
    experts_gate_up_scale_2: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    # quant method -> {declared algorithm: {"error", "where"}} its MoE scheme choice refuses (tools/sglang_moe_schemes.py)
    moe_scheme_refused: Mapping[str, Mapping[str, Mapping[str, str]]] = field(default_factory=dict)
    # arch -> [{"backend", "when", "where"}]: its own server-arg override of the MoE backend (tools/sglang_moe_overrides.py)
    moe_backend_overrides: Mapping[str, tuple[Mapping[str, str], ...]] = field(default_factory=dict)
    # quant method -> {declared algorithm: {"error", "where"}} its Linear scheme choice refuses (sglang_linear_schemes.py)
    linear_scheme_refused: Mapping[str, Mapping[str, Mapping[str, str]]] = field(default_factory=dict)
    # quant method -> {"error", "where", "refused": {sparsity format: schemes}}: a Linear its 2:4 sparsity check refuses
    sparse_24_refused: Mapping[str, Mapping] = field(default_factory=dict)  # (tools/sglang_sparse24.py)
    # arch -> modules its model builds in some layers only, by config.json (tools/sglang_layer_drops.py; arch/layer_rules.py)
    dropped_in_layers: Mapping[str, tuple[LayerDrop, ...]] = field(default_factory=dict)
    # {"transformers", "known", "error", "where"}: the model_types its config reader knows (tools/sglang_config_types.py)
    config_model_types: Mapping = field(default_factory=dict)
    # quant_algo -> {"model_types", "architecture_prefixes"}: the classes its config reader spares a `refused_algorithms`
    # reading (0.5.10-0.5.14 read MIXED_PRECISION as modelopt_mixed for NemotronH only; tools/sglang_rules_table.py)
    refused_spared: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    # arch -> {"field", "by_model_type": {model_type: {"accepts", "refused", "past_depth", "short"}}}: per-layer values
    # its build refuses (tools/sglang_layer_values.py; doctor/layer_values.py)
    layer_values_refused: Mapping[str, Mapping] = field(default_factory=dict)
    # model_type -> {listed name: the name its config class writes} (tools/sglang_registry_renames.py; arch/registry.py)
    registry_renamed: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def spares(self, algorithm: str, config: dict | None) -> bool:
        """Whether config.json's model_type or an architecture is one its reader spares `algorithm`'s refusal."""
        spared, config = self.refused_spared.get(algorithm), config if isinstance(config, dict) else {}
        archs = config.get("architectures") if isinstance(config.get("architectures"), list) else []
        return spared is not None and (config.get("model_type") in spared["model_types"] or any(
            isinstance(a, str) and a.startswith(tuple(spared["architecture_prefixes"])) for a in archs))

    def raises_on_extra(self, architecture: str, layer: str) -> bool:
        """Whether `architecture`'s load_weights raises KeyError for a tensor fused `layer` has no parameter for."""
        return any(layer.endswith(s) for s in self.stacked_unchecked.get(architecture, ()))

    @property
    def label(self) -> str:
        return f"{self.runtime} {'.'.join(map(str, self.release))}"

    @property
    def model_registry(self) -> Registry | None:
        """Its `registry` as arch/registry.py reads it (None: not recorded, the first listed name is built)."""
        return Registry.named(self.registry, self.label, self.source, self.backend, self.registry_rule, self.registry_renamed)

    @property
    def speaker(self) -> str:
        return f"{self.display} {'.'.join(map(str, self.release))}"

    def building(self, architecture: str, fusions: Mapping[str, tuple[str, ...]] | None,
                 config: dict | None = None) -> Building:
        """How this release builds `architecture`: the model's fusions (the layer rows'), its class's packed mapping
        and what the class adds to it for this config. Where `built_layers` lists the layers the release's model
        builds, a row fusion whose leaf names none of them is the rows' runtime's layer, not this release's (vLLM's
        DeepSeek-V4 `fused_wqa_wkv`; SGLang builds `wqkv_a`): its shards are asked as themselves."""
        packed = dict(self.packed.get(architecture, {}))
        built = {p.rpartition(".")[2] for p in self.built_layers.get(architecture, {})}
        fusions = {k: v for k, v in (fusions or LLAMA_FUSIONS).items() if not built or self.fusion_names.get(k, k) in built}
        text = (config or {}).get("text_config") if isinstance((config or {}).get("text_config"), dict) else {}
        for key, added in self.packed_when.get(architecture, {}).items():  # absent: its config class's default, set
            if (config or {}).get(key, text.get(key, True)) is not None:    # in transformers' (DeepseekV2Config 1536)
                packed |= added
        named = ({self.fusion_names.get(k, k): tuple(v) for k, v in fusions.items()} | packed
                 | dict(self.model_fusions.get(architecture, {})))
        return Building(MappingProxyType(named), MappingProxyType(packed), self.fallback_fused,
                        self.own_layers.get(architecture, ()))

    def undescribed(self, declaration: Declaration, readers: tuple[str, ...] = ()) -> str:
        """The one line for a form this file does not describe; `readers`: targets of this runtime whose files do."""
        others = "".join(f"--target {r} or " for r in readers)
        return (f"{self.speaker}: how it reads a {declaration.format.NAME} checkpoint is not described in {self.source}, so "
                f"doctor cannot judge it for this target; judge it with {others}a vllm target (--target vllm==0.32.0)")

    def reading_refusal(self, declaration: Declaration, config: dict | None) -> str | None:
        """Why this release reads `config` otherwise than its matcher for the form answers (READING_REFUSALS), or None."""
        refuse = READING_REFUSALS.get(self.matchers.get(CONFIG_KINDS.get(declaration.format.NAME), ""))
        names = (config or {}).get("architectures") if isinstance((config or {}).get("architectures"), list) else []
        built = next((self.built_layers[a] for a in names if isinstance(a, str) and a in self.built_layers), {})
        return refuse(config, built, self.speaker) if refuse else None

    def entries_unread(self, declaration: Declaration) -> str | None:
        """Why no exclusion entry fix could write for the form is read by this release (UNREAD_ENTRIES), or None."""
        said = UNREAD_ENTRIES.get(self.matchers.get(CONFIG_KINDS.get(declaration.format.NAME), ""))
        return said(self.speaker) if said else None

    def bind(self, declaration: Declaration, building: Building, config: dict | None) -> Declaration:
        """The declaration whose exclusion and per-layer questions this release's matchers answer; layers of an
        MTP/NextN draft whose model code drops the quant config (`draft.mtp`) are built BF16 whatever the lists say."""
        kind = CONFIG_KINDS.get(declaration.format.NAME)
        if kind not in self.matchers:  # a form this file does not describe: judged as another runtime reads it, it lies
            raise BadInput(self.undescribed(declaration))
        names = (config or {}).get("architectures") if isinstance((config or {}).get("architectures"), list) else []
        said = self.reading_refusal(declaration, config)
        if said:
            raise BadInput(f"config.json: {said}; doctor cannot judge it for this target; judge it with --target vllm==0.32.0")
        flat = flat_exclusions(config) if kind == "modelopt" and quant_method(declaration) in self.nested_drops else None
        excl = source_named(exclusion_matcher(self.matchers[kind]), list_sources(declaration, config, flat))
        layers = layer_matcher(self.matchers["quantized_layers"])
        dropped = self.draft_bf16_prefixes(declaration, config)
        plain = frozenset(p for a in names if isinstance(a, str) for p in self.plain_layers.get(a, ()))

        mtp = tuple(self.mtp_layers(config))
        own: list[CtTargets] = []  # the config groups' targets, compiled once for every rule this declaration builds

        def matcher(entries, targets):
            if targets is declaration.targets:  # what Declaration.rule passes: no 20,000-entry tuple hashed per rule
                if not own:
                    own.append(CtTargets.compile(targets))
                targets = own[0]
            rule = excl(entries, targets, building)
            rule = MtpLayers(rule, tuple(m for m in mtp if rule.excludes(m))) if mtp else rule
            rule = UnreadList(excl(flat, targets, building), rule) if flat is not None else rule
            return DraftBf16(rule, dropped, plain) if dropped or plain else rule

        def lookup(algos, name):
            return (None, None) if name.startswith(dropped) else layers(algos, name, building)
        groups = declaration.group_algos
        if groups is not None and self.ct_target_order:
            groups = groups.ordered(self.ct_target_order)  # the release tries config-group targets in its own order
        return replace(declaration, matcher=matcher, layer_lookup=lookup, group_algos=groups)

    def mtp_layers(self, config: dict | None) -> dict[str, int]:
        """The name of each MTP layer the config declares (num_nextn_predict_layers) that this release builds from the
        model's own config, `draft.mtp_layer` with its index (DeepSeek-style one-model MTP: num_hidden_layers + i)
        -> i; empty for a release without the rule."""
        template, config = self.draft.get("mtp_layer"), config or {}
        n, k = _int(config.get("num_hidden_layers")), _int(config.get("num_nextn_predict_layers") or 0)
        if not isinstance(template, str) or n is None or k is None:
            return {}
        return {template.replace("{index}", str(n + i)): i for i in range(min(k, 64))}

    def draft_bf16_prefixes(self, declaration: Declaration, config: dict | None) -> tuple[str, ...]:
        """Name prefixes of the MTP/NextN layers this release builds BF16 for this checkpoint's architecture."""
        config = config or {}
        names = config.get("architectures") if isinstance(config.get("architectures"), list) else []
        method = quant_method(declaration)
        out = []
        for rule in self.draft.get("mtp", ()):
            if not any(a in rule["architectures"] for a in names):
                continue
            when = set(rule["bf16_when"])
            mtp_keys = declaration.layer_algos is not None and any(k.startswith("mtp.") for k in declaration.layer_algos.as_dict())
            if method in when or (method == "modelopt_mixed" and not mtp_keys and "modelopt_mixed_without_mtp_keys" in when):
                layers = _int(config.get("num_hidden_layers") or (config.get("text_config") or {}).get("num_hidden_layers"))
                if "{num_hidden_layers}" not in rule["layers"] or layers is not None:
                    out.append(rule["layers"].replace("{num_hidden_layers}", str(layers)))
        return tuple(out)


def quant_method(declaration: Declaration) -> str | None:
    """The quantization method name the runtime gives the checkpoint's config (model_config.py's detection)."""
    if not declaration.quantized:
        return None
    if declaration.format.NAME == "compressed-tensors":
        return "compressed-tensors"
    algo = declaration.quant_algo or ""
    return "modelopt_mixed" if algo == "MIXED_PRECISION" else "modelopt_fp4" if "FP4" in algo else "modelopt_fp8"


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 20 else None


def read_rules(doc: dict, source: str) -> RuntimeRules:
    """A data file's rules block (a malformed shipped file is our bug: KeyError names the key)."""
    body = doc["rules"]
    missing = [k for k in KINDS if k not in body["matchers"]]
    if missing:
        raise KeyError(f"{source}: rules.matchers lacks {missing}")
    for kind in KINDS[:2]:
        exclusion_matcher(body["matchers"][kind])
    layer_matcher(body["matchers"]["quantized_layers"])
    packed = {a: {k: tuple(v) for k, v in m.items()} for a, m in body.get("packed_modules_mapping", {}).items()}
    when = {a: {key: {k: tuple(v) for k, v in m.items()} for key, m in keys.items()}
            for a, keys in body.get("packed_when_config", {}).items()}
    return RuntimeRules(doc["runtime"], tuple(int(p) for p in doc["release"].split(".")), source, body["display"], body["matchers"],
                        bool(body["follows_draft_config"]), body["layer_rows"], body["fused"], body["unknown_tensors"],
                        body["loaders"], body["draft"], body["errors"], body["refused_algorithms"],
                        bool(body["fallback_fused"]), packed, body.get("fusion_names", {}), body.get("layer_classes", {}),
                        tuple(body.get("row_parallel_leaves", ())), when,
                        {a: tuple(v) for a, v in body.get("stacked_unchecked", {}).items()},
                        tuple(body.get("nested_config_json_drops_exclusions", ())),
                        {a: tuple(v) for a, v in body.get("plain_layers", {}).items()},
                        tuple(body.get("ct_target_order", ())), body.get("built_layers", {}), body.get("layer_names", {}),
                        body.get("null_exclusions_refused", {}), {a: tuple(v) for a, v in body.get("own_layers", {}).items()},
                        {a: {k: tuple(v) for k, v in m.items()} for a, m in body.get("model_fusions", {}).items()},
                        body.get("missing_weights", {}), frozenset(body.get("registry", ())),
                        Backend.read(body.get("transformers_backend")), FirstListed.read(body.get("registry_rule")),
                        body.get("experts_gate_up_scale_2", {}), body.get("moe_scheme_refused", {}),
                        {a: tuple(v) for a, v in body.get("moe_backend_overrides", {}).items()},
                        body.get("linear_scheme_refused", {}), body.get("sparse_24_refused", {}),
                        {a: tuple(d for module, rule in sorted(rules.items()) for d in layer_drops(module, rule, source))
                         for a, rules in body.get("dropped_in_layers", {}).items()},
                        {**body["config_model_types"], "known": frozenset(body["config_model_types"]["known"])}
                        if "config_model_types" in body else {},
                        {a: {k: tuple(v) for k, v in m.items()} for a, m in body.get("refused_spared", {}).items()},
                        body.get("layer_values_refused", {}), body.get("registry_renamed", {}))


def shipped_rules() -> tuple[RuntimeRules, ...]:
    """Every shipped rules file, oldest release first per runtime."""
    out = []
    for item in DATA.iterdir():
        if item.name.endswith(".json"):
            doc = json.loads(item.read_text(encoding="utf-8"))
            if "rules" in doc:
                out.append(read_rules(doc, item.name))
    return tuple(sorted(out, key=lambda r: (r.runtime, r.release)))
