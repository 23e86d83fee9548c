"""What every checkpoint format plug-in provides, and the declaration value they all return.

A format knows how its tensors group into modules, which stored names play which role, how its
config declares quantization and exclusions, and how to write those declarations back. The rest
of the tool works on `StoredModule`s and `Declaration`s, so a new format (FP8 block, MXFP4) is a
new file in this package (a `Format` subclass and its instance) plus one entry in `FORMATS`.

Roles use ModelOpt's names: "weight" (packed or plain), "weight_scale" (fp8 block scales),
"weight_scale_2" (the per-tensor global scale, a multiplier, or a divisor where the format's
`GLOBAL_SCALE_IS_DIVISOR` says so) and "input_scale".
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable, Protocol

from repair.formats.algorithms import LayerAlgorithms
from repair.io.checkpoint import Checkpoint
from repair.io.safetensors import TensorInfo
from repair.formats.modules import StoredModule

CANONICAL_ROLES = ("weight", "weight_scale", "weight_scale_2", "input_scale")
Covers = Callable[[list[str], str], bool]  # covers(exclusions, module): does the list already exclude it


class Rule(Protocol):
    """A format's exclusion rule over one list, compiled once (`Format.rule`)."""

    def excludes(self, prefix: str) -> bool: ...
    def shard_excluded(self, prefix: str) -> bool: ...
    def used_entries(self, prefixes: Iterable[str]) -> frozenset[str]: ...  # entries excluding one of them on their own


@dataclass(frozen=True)
class Declaration:
    """What the config files claim about quantization (None where a file or key is absent)."""

    quant_algo: str | None
    ignore: tuple[str, ...] | None  # config.json quantization_config.ignore
    exclude_modules: tuple[str, ...] | None  # hf_quant_config.json quantization.exclude_modules (ModelOpt only)
    format: Format  # whose matching rules apply
    targets: tuple[str, ...] | None = None  # compressed-tensors config_groups targets (None: every linear)
    layer_algos: LayerAlgorithms | None = None  # MIXED_PRECISION: the quantized_layers vLLM reads (config.json's, else hf's)
    hf_layer_algos: LayerAlgorithms | None = None  # hf_quant_config.json's quantized_layers (doctor compares the two)
    kv_cache: str | None = None  # the KV-cache quantization declared ("FP8"), None when none is
    group_algos: object | None = None  # compressed-tensors groups of different schemes (formats/ct_groups.GroupSchemes)
    sparsity: object | None = None  # compressed-tensors' sparsity_config (formats/ct_groups.Sparsity); None: none
    block_scale_dtype: str = "F32"  # the dtype the runtime's FP8 block scale parameter has (DeepSeek-V4 fp4: F8_E8M0)
    # a target runtime's own rules (repair/targets/runtime_rules.py bind); None: the format's, as vLLM applies them
    matcher: Callable | None = field(default=None, compare=False, hash=False, repr=False)  # (entries, targets) -> Rule
    layer_lookup: Callable | None = field(default=None, compare=False, hash=False, repr=False)  # (algos, name) -> (algo, error)
    # a runtime reading the per-layer map's keys mapped (targets/entry_mappers.py): name -> the written keys it reads as
    # that layer or one under it, whatever their spelling; None: the keys are read as written
    layer_keys: Callable | None = field(default=None, compare=False, hash=False, repr=False)
    _rules: dict = field(default_factory=dict, init=False, compare=False, hash=False, repr=False)  # list -> its compiled Rule

    def rule(self, exclusions: tuple[str, ...] | list[str] | None = None) -> Rule:
        """The format's rule over `exclusions` (default: the list vLLM uses), compiled once per list and kept here."""
        key = None if exclusions is None else tuple(exclusions)  # None: no 489-entry tuple to build and hash per call
        found = self._rules.get(key)
        if found is None:
            found = self._rules[key] = (self.matcher or self.format.rule)(tuple(self.exclusions) if key is None else key, self.targets)
        return found

    @property
    def quantized(self) -> bool:
        return self.quant_algo is not None

    @property
    def exclusions(self) -> tuple[str, ...]:
        """The list vLLM uses: config.json's when present, else hf_quant_config.json's."""
        if self.ignore is not None:
            return self.ignore
        return self.exclude_modules or ()

    def used_entries(self, prefixes: set[str], entries: tuple[str, ...] | None = None) -> frozenset[str]:
        """The entries (default: the list vLLM uses) that exclude one of `prefixes` on their own: one pass over the
        names under the format's rule; a runtime's own rule (repair/targets/matchers.py, no index) is asked entry by
        entry, as it reads each one."""
        if self.matcher is None or hasattr(self.rule(entries), "used_entries"):  # an index pass (vLLM's fused tests too)
            return self.rule(entries).used_entries(prefixes)
        return frozenset(e for e in (self.exclusions if entries is None else entries) if any(self.excludes(p, [e]) for p in prefixes))

    def excludes(self, prefix: str, exclusions: tuple[str, ...] | list[str] | None = None) -> bool:
        """True when vLLM builds the layer at `prefix` unquantized under this format's matching rules.

        Under MIXED_PRECISION a layer `quantized_layers` does not resolve is unquantized too, unless an
        explicit `exclusions` list is asked about (then only that list's rule applies)."""
        rule = self.rule(exclusions)
        if exclusions is not None and hasattr(rule, "names"):
            return rule.names(prefix)  # a runtime's own rule: whether these entries name the layer as it reads them
        if rule.excludes(prefix):
            return True
        return exclusions is None and self.layer_algos is not None and self._layer_algo(prefix) is None

    def algorithm(self, prefix: str, packed: dict[str, tuple[str, ...]] | None = None) -> str | None:
        """The algorithm the config declares for the runtime layer `prefix` (None: unquantized or excluded).

        One quant_algo covers every layer not excluded; MIXED_PRECISION resolves the layer from
        `quantized_layers` in vLLM 0.32's order (`LayerAlgorithms.lookup`; `packed` is the model's
        packed_modules_mapping), after the exclusion lists, as ModelOptMixedPrecisionConfig.get_quant_method does."""
        if self.group_algos is not None:  # ignore entries, then the first config-group target matching the layer
            return None if self._ignored(prefix, packed) else self.group_algos.resolve(prefix, packed)
        if not self.quantized or self.rule().excludes(prefix):
            return None
        return self.quant_algo if self.layer_algos is None else self._layer_algo(prefix, packed)

    def _ignored(self, prefix: str, packed: dict[str, tuple[str, ...]] | None) -> bool:
        """compressed-tensors' should_ignore_layer: an ignore entry names the layer, or every shard of a packed one."""
        rule = self.rule()
        fused = next((k for k in packed or {} if prefix.endswith(k)), None)
        if fused is None:
            return rule.shard_excluded(prefix)
        return all(rule.shard_excluded(prefix.replace(fused, shard)) for shard in packed[fused])

    def _layer_algo(self, prefix: str, packed: dict[str, tuple[str, ...]] | None = None) -> str | None:
        if self.layer_lookup is not None:
            return self.layer_lookup(self.layer_algos, prefix)[0]
        return self.layer_algos.resolve(routed_layer(prefix), packed)


def routed_layer(prefix: str) -> str:
    """The layer vLLM builds a stored module into for a per-layer lookup: one expert's projection
    (`...mlp.experts.3.gate_proj`) belongs to the routed-experts layer `...mlp.experts`."""
    cut = prefix.find(".experts.")
    return prefix[: cut + len(".experts")] if cut >= 0 else prefix


class Format(ABC):
    """A checkpoint format: one instance per format, registered in `repair.formats.FORMATS`."""

    NAME: ClassVar[str]
    GLOBAL_SCALE_IS_DIVISOR: ClassVar[bool]
    RUNTIME_LEAVES: ClassVar[dict[str, str]]  # stored leaf name -> role, for the parameters vLLM allocates for a packed layer
    UNSUPPORTED: ClassVar[dict[str, str]] = {}  # operation ("requantize", "original", "tp") -> why it cannot run
    NEEDS_LAYER_ROWS: ClassVar[bool] = False  # its schemes are per layer of the class: judged only with the release's rows
    FUSED_REFUSAL: ClassVar[str]  # vLLM's exact error when a fused layer's shards differ in precision ({prefix}: the fused layer)
    # how vLLM's config of this form rewrites its lists with a class's weight-name mapper (targets/entry_mappers.py)
    ENTRY_MAPPING: ClassVar[str | None] = None

    def __repr__(self) -> str:
        return f"<format {self.NAME}>"

    @abstractmethod
    def claims(self, ckpt: Checkpoint) -> bool: ...
    @abstractmethod
    def group_modules(self, infos: dict[str, TensorInfo]) -> list[StoredModule]: ...
    @abstractmethod
    def check_packed(self, module: StoredModule, infos: dict[str, TensorInfo], where: str, out_dtype: str = "BF16") -> None: ...
    @abstractmethod
    def read_declaration(self, ckpt: Checkpoint) -> Declaration: ...
    @abstractmethod
    def rule(self, exclusions: tuple[str, ...] | list[str], targets: tuple[str, ...] | None) -> Rule:
        """The format's exclusion rule as vLLM applies it (`excludes`, and `shard_excluded`, the per-shard test of a
        fused layer's shards), compiled once for the list; `Declaration.rule` keeps it."""

    def excludes(self, prefix: str, exclusions: tuple[str, ...] | list[str], targets: tuple[str, ...] | None) -> bool:
        """The rule for one layer (compiles the list: a caller asking about many keeps `rule`)."""
        return self.rule(exclusions, targets).excludes(prefix)
    @abstractmethod
    def exclusion_entry(self, module: str) -> str: ...
    @abstractmethod
    def with_exclusions(self, ckpt: Checkpoint, names: list[str], covers: Covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]: ...
    @abstractmethod
    def exclusion_lists(self, config: dict | None, hf_quant: dict | None) -> list[list[str]]: ...
    @abstractmethod
    def without_entries(self, config: dict | None, hf_quant: dict | None, entries: frozenset[str]) -> tuple[dict | None, dict | None]: ...

    def fused_refusal(self, fused: str, shards: tuple[str, ...], rule: Rule) -> str | None:
        """vLLM's error text when it refuses the fused layer `fused` (runtime names throughout), else None.

        Both vLLM configs first test the fused name itself; only when it is not listed do they test each
        shard, and shards that disagree stop the model build."""
        if hasattr(rule, "fused_refusal"):
            return rule.fused_refusal(fused, shards)  # a runtime's own rule knows its policy and its words
        if rule.shard_excluded(fused):
            return None
        decided = {rule.shard_excluded(s) for s in shards}
        return self.FUSED_REFUSAL.format(prefix=fused) if len(decided) > 1 else None

    def without_quantization(self, ckpt: Checkpoint) -> dict | None:
        """config.json contents for a plain BF16 checkpoint (no quantization_config), whatever the format."""
        config = copy.deepcopy(ckpt.config)
        if config is not None:
            config.pop("quantization_config", None)
        return config

    def unsupported(self, operation: str) -> str | None:
        """Why `operation` ("requantize", "original", "tp") cannot run on this format, or None."""
        reason = self.UNSUPPORTED.get(operation)
        return f"{self.NAME} checkpoint: {reason}" if reason else None
