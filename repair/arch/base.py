"""What the tool knows of a model family, as values: module specs, layer kinds, and the runtime's names.

An `Architecture` is one row of `repair.arch.ARCHITECTURES`: the config.json `architectures` (or
`model_type`) it covers, how vLLM renames its modules before matching them against exclusion lists
(`runtime_name`), which name an exclusion entry uses (`exclusion_name`), and, where the tool has a
loader profile for it, its expected modules and how the runtime builds each layer role. A family
without a row gets `GENERIC`: identity names and no loader profile.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable

from repair.arch.layer_rules import LayerDrop, dropped_modules
from repair.arch.roles import GENERIC_ROLES, LLAMA_FUSED, UnquantizedRole, role_index
from repair.formats.base import Covers, Declaration
from repair.io.regex_index import PatternIndex


@dataclass(frozen=True)
class ModuleSpec:
    """What the model defines for one parameter: full-precision shape and the layer's role."""

    name: str
    shape: tuple[int, ...]
    role: str  # pre_projection, post_projection, q_proj, o_proj, gate_proj, up_proj, down_proj, embed, norm, ...

    @property
    def is_linear(self) -> bool:
        return self.role in LINEAR_ROLES


LINEAR_ROLES = frozenset({"pre_projection", "post_projection", "q_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "centroids", "lm_head"})


@dataclass(frozen=True)
class DroppedTensor:
    """A checkpoint tensor the runtime's own load_weights takes and fills nothing with (vLLM 0.32's laguna.py and the
    routed experts' `e_score_correction_bias`), recorded from its code: the parameter meant for it keeps its initial
    value; `refused`: the words of the runtime's weights check, which then stops the load (None: it passes)."""

    regex: str  # re.search on checkpoint tensor names
    parameter: str  # the parameter left unfilled, `*` for the tensor's layer numbers in order
    refused: str | None
    why: str  # whose code says so, for messages

    def parameter_for(self, tensor: str) -> str:
        numbers = iter(re.findall(r"\.(\d+)(?=\.|$)", tensor))
        return re.sub(r"(?<=\.)\*(?=\.|$)", lambda _: next(numbers, "*"), self.parameter)


@dataclass(frozen=True)
class RefusedLoad:
    """The runtime release's own loader takes no checkpoint of this architecture, whatever its quantization: its model
    class's load_weights raised `error` on transformers' own BF16 checkpoint of it (vLLM 0.28-0.32's dbrx.py and
    olmo_hybrid.py), recorded from its code (tools/vllm_load_refused.py)."""

    error: str  # the runtime's exception, `Type: message`
    release: str  # the release, as messages name it ("vllm 0.32.0")
    source: str  # the profile file it is recorded in


@dataclass(frozen=True)
class RefusedConfig:
    """config.json sets some of the fields one build reads together and leaves others null, or sets them to values its
    validation does not take, which the release refuses while reading it (transformers' Qwen4ExpConfig, run by vLLM
    0.32: "QSA config is missing required fields", "requires indexer_kv_heads=1"), recorded from its own config loading
    (the profile's `without.partly_null_refused` and `without.value_refused`; arch/configured.py)."""

    fields: tuple[str, ...]  # the fields it names, in the order the profile lists the build's fields
    problem: str  # what config.json holds there, as a message says it
    remedy: str  # what to do
    error: str | None  # the exception, `Type: message`, where recorded for exactly this case; None: not recorded
    release: str  # the release, as messages name it ("vllm 0.32.0")
    source: str  # the profile file it is recorded in


@dataclass(frozen=True)
class LayerKind:
    """How a runtime builds one layer role: its tensor-parallel style and class name."""

    style: str  # column | row | merged | vocab | replicated
    runtime_class: str
    fused_name: str | None = None  # gate_proj/up_proj load into gate_up_proj


def identity(module: str) -> str:
    return module


@dataclass(frozen=True)
class Architecture:
    """One model family's knowledge; every field defaults to "nothing known" (identity names, no profile)."""

    name: str
    architectures: tuple[str, ...] = ()  # config.json `architectures` entries this row covers
    model_types: tuple[str, ...] = ()  # or its `model_type`
    runtime_name: Callable[[str], str] = identity  # checkpoint module -> the prefix vLLM's quantization config sees
    exclusion_name: Callable[[str], str] = identity  # checkpoint module -> the name an exclusion entry must use
    expected_modules: Callable[[dict, str], dict[str, ModuleSpec]] | None = None  # None: no loader profile
    layer_kinds: dict[str, LayerKind] = field(default_factory=dict)  # ModuleSpec.role -> how vLLM builds it
    bf16_handshake: tuple[str, ...] = ()  # layers the family keeps in BF16 by design
    unquantized_roles: tuple[UnquantizedRole, ...] = GENERIC_ROLES  # roles vLLM never quantizes (arch/roles.py)
    fused_layers: dict[str, tuple[str, ...]] = field(default_factory=lambda: dict(LLAMA_FUSED))  # vLLM's packed_modules_mapping
    # layers the class builds as one parameter from 2+ checkpoint modules that no packed_modules_mapping names (so its
    # exclusion test asks the fused name alone): a profile's renames (StableLM's qkv_proj); the Gemma 4 assistant's gate_up_proj
    merged_layers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    nvfp4_load_refused: tuple[tuple[str, str], ...] = ()  # (re.search on checkpoint names, why): load_weights fails on NVFP4
    dropped_tensors: tuple[DroppedTensor, ...] = ()  # tensors load_weights takes and fills no parameter with
    # (checkpoint name prefix, why): load_weights drops every tensor under it unread (MiMo's model.mtp_layers.)
    unread_prefixes: tuple[tuple[str, str], ...] = ()
    dropped_in_layers: tuple[LayerDrop, ...] = ()  # modules the runtime builds in some layers only (arch/layer_rules.py)
    load_refused: RefusedLoad | None = None  # the release loads no checkpoint of it (its load_weights fails)
    # checkpoint-side layer name (a fused one: `...self_attn.qkv_proj`) -> the release builds it with a quantized method
    # when nothing is excluded, so it asked its quant config (a generated row's state); None: not known (hand, generic)
    built_quantized: Callable[[str], bool] | None = None
    # (checkpoint module pattern, `*` a layer number; why): loaded in every layer that stores a module of its block
    # (Qwen4Exp's QSA indexer under self_attn: the profile's `without.loads_only_with`)
    required_modules: tuple[tuple[str, str], ...] = ()
    # (checkpoint module or tensor pattern, `*` a layer number; the release's error, its layer numbers `*`; why; what
    # to do): load_weights raises on any tensor stored under it (Qwen4Exp without QSA has no parameter for the indexer:
    # the module the profile's `without.refused_only_with` errors name; the profile's `weight_refused`)
    refused_modules: tuple[tuple[str, str, str, str], ...] = ()
    refused_config: RefusedConfig | None = None  # the release refuses this config.json while reading it
    # why the release's row of the class was not used for this config.json (GENERIC's, arch/configured.py disagreement)
    not_covered: str = ""

    def dropped(self, config: dict | None) -> frozenset[str]:
        """Checkpoint module names this release builds in no layer of that name, for this config.json."""
        return dropped_modules(self.dropped_in_layers, config)

    def borrowed(self) -> Architecture:
        """The row as a runtime whose rules borrow it (SGLang, TensorRT-LLM) takes it: without the names vLLM's own model
        code gives the layers (a hand row's runtime_name / exclusion_name: the Gemma 4 assistant's `draft_model.`
        prefixes, which only vLLM's speculative wrapper adds), as a generated row drops its `prefixes` (profiled.py
        OWN_CODE); that runtime asks the checkpoint's names."""
        return replace(self, runtime_name=identity, exclusion_name=identity)

    def matches(self, built: str | None, config: dict | None) -> bool:
        """This row describes the class a release builds: `built`, the listed name it builds (arch/registry.py; not
        any listed name: [DbrxForCausalLM, Qwen3_5MoeForConditionalGeneration] builds DBRX), or a model_type it claims."""
        return built in self.architectures or self.claims(config)

    def claims(self, config: dict | None) -> bool:
        """The runtime builds this row for the config's model_type whatever `architectures` lists (vLLM 0.32 loads a
        gemma4_assistant as the draft class Gemma4MTPModel: config/speculative.py:1019-1028)."""
        return bool(self.model_types) and isinstance(config, dict) and config.get("model_type") in self.model_types

    def unquantized_role(self, module: str, declaration: Declaration) -> UnquantizedRole | None:
        """The role under which vLLM builds this checkpoint module unquantized whatever the config says, or None."""
        hits = self.roles_index.matching(module)  # one RE2 pass for every role's pattern; most modules have none
        return next((r for i, r in enumerate(self.unquantized_roles)
                     if i in hits and r.applies(declaration.format.NAME, declaration.quant_algo)), None) if hits else None

    @cached_property
    def roles_index(self) -> PatternIndex:
        """The roles' patterns (re.search), compiled together on first use."""
        return role_index(self.unquantized_roles)

    def declared(self, module: str, declaration: Declaration) -> str:
        """What the config declares for a weight-bearing layer, read as vLLM reads it: "quantized", "excluded",
        or "-" (no quantization declared, or a role vLLM never quantizes)."""
        if not declaration.quantized or self.unquantized_role(module, declaration) is not None:
            return "-"
        asked = self.asked_name(module)
        return "excluded" if declaration.excludes(asked) and not self._fused_declared(asked, declaration) else "quantized"

    def _fused_declared(self, shard: str, declaration: Declaration) -> bool:
        """Whether a per-layer map declares the fused layer vLLM builds a shard no exclusion names into (a key naming
        `...qkv_proj` itself, or another shard: vLLM asks the fused name, modelopt.py _resolve_quant_algo)."""
        parent, _, leaf = shard.rpartition(".")
        fused = next((f for f, shards in self.fused_layers.items() if leaf in shards), None)
        if declaration.layer_algos is None or not fused or not parent or declaration.rule().excludes(shard):
            return False
        return declaration.algorithm(f"{parent}.{fused}", self.fused_layers) is not None

    def asked_as(self, module: str) -> str:
        """The checkpoint-side name vLLM asks its quant config about for `module`: a shard of a layer built from 2+
        checkpoint modules that no packed_modules_mapping names (`merged_layers`) is asked as that layer alone
        (quant_utils.py is_layer_skipped sees `qkv_proj`: Orion's and StableLM's q/k/v_proj excluded one by one leave
        qkv_proj NVFP4, and the load stops on their BF16 weights; measured). Not where the release builds that layer
        with no quant method (`built_quantized`: OlmoHybrid's conv1d from q/k/v_conv1d asks nothing), nor routed experts."""
        parent, _, leaf = module.rpartition(".")
        merged = next((f for f, shards in self.merged_layers.items() if leaf in shards and f not in self.fused_layers), None)
        if not merged or not parent or ".experts." in module:
            return module
        layer = f"{parent}.{merged}"
        return layer if self.built_quantized is None or self.built_quantized(layer) else module

    def asked_name(self, module: str) -> str:
        """`asked_as`, as the runtime names it (`runtime_name`)."""
        return self.runtime_name(self.asked_as(module))

    def fused_groups(self, modules) -> list[tuple[str, tuple[str, ...]]]:
        """(fused checkpoint-name layer, its stored shard modules) for every layer vLLM fuses from 2+ stored shards.
        Routed experts are not among them: vLLM builds them as one expert layer with its own rule."""
        names = set(modules)
        out = []
        for fused, shards in self.fused_layers.items():
            parents = sorted({n[: -len(s)] for n in names for s in shards if n.endswith("." + s) and ".experts." not in n})
            for parent in parents:
                members = tuple(parent + s for s in shards if parent + s in names)
                if len(members) > 1:
                    out.append((parent + fused, members))
        return out

    @property
    def one_parameter_layers(self) -> dict[str, tuple[str, ...]]:
        """Every layer the class builds as one parameter from shards (leaf -> shard leaves): its fused layers and the
        layers only its loader merges (`merged_layers`: StableLM's qkv_proj from a rename), which vLLM builds in one
        scheme just the same and asks its quant config about under the layer's own name."""
        return {**self.merged_layers, **self.fused_layers}

    def scale_groups(self, modules) -> list[tuple[str, tuple[str, ...]]]:
        """(fused layer, its stored shards) for every layer the class builds as one parameter, whether or not a
        packed_modules_mapping names it: the shards share one weight_scale_2 at runtime."""
        return replace(self, fused_layers=self.one_parameter_layers).fused_groups(modules)

    def asked_shards(self, fused: str, stored: tuple[str, ...]) -> tuple[str, ...]:
        """The shard names vLLM's exclusion test asks for the fused layer `fused` (checkpoint names): where the layer asks
        its quant config (`built_quantized`), the class's whole packed mapping, stored or not (quant_utils.py
        is_layer_skipped, 0.32: Qwen4Exp's qkv_proj asks `indexer.index_qk_proj` in a model built without QSA too);
        else, or where that is not known, the `stored` shards (a layer built with no quant config asks nothing)."""
        if self.built_quantized is None or not self.built_quantized(fused):
            return stored
        parent, _, leaf = fused.rpartition(".")
        return tuple(f"{parent}.{s}" if parent else s for s in self.fused_layers.get(leaf, ())) or stored

    def exclusion_matcher(self, declaration: Declaration) -> Covers:
        """covers(exclusions, module): the format's rule, applied to the name the runtime gives the module."""
        return lambda exclusions, module: declaration.excludes(self.runtime_name(module), exclusions)


GENERIC = Architecture("generic")
