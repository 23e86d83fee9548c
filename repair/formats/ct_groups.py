"""compressed-tensors config groups with different schemes: which group's scheme each layer is built with.

vLLM 0.32 (compressed_tensors.py `_quantization_scheme_map_from_config`, `get_scheme_dict`; utils.py
`find_matched_target`, `_match_fused_layer`; quantization/utils/config_utils.py `is_equal_or_regex_match`) and
SGLang 0.5.23 (the same functions in its compressed_tensors package) flatten the groups' targets into one ordered
map, target -> scheme: a target listed by two groups keeps its first position and takes the later group's scheme.
A layer not ignored gets the scheme of the first target matching it, tried in three passes:
  * "name": equal to its prefix, or `re:REGEX` with re.match;
  * "fused": a packed layer (`qkv_proj`) whose every shard matches some target (name pass): the first shard's target;
  * "class": a plain target contained, case-insensitively, in the layer's class name (`Linear` in `RowParallelLinear`).
vLLM tries name, fused, class; SGLang name, class, fused (`ORDERS`; a release's data names its order).
Each group's scheme is read from its real fields (`group_algorithm`); one the tool cannot read is refused in one line.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Mapping

from repair.errors import BadInput
from repair.io.patterns import MATCH, RegexSet

NVFP4_FORMAT, FP8_FORMAT = "nvfp4-pack-quantized", "float-quantized"
MIXED_FORMAT = "mixed-precision"  # compressed-tensors' top-level format when its groups' formats differ
FP8_BLOCK = "FP8_BLOCK"  # float8_e4m3fn weight [out, in] with a float32 scale per 128x128 block
MIXED_GROUPS = "MIXED_GROUPS"  # the declaration's quant_algo when config groups name different schemes
ORDERS = {"vllm": ("name", "fused", "class"), "sglang": ("name", "class", "fused")}
LINEAR_CLASS = "RowParallelLinear"  # every LinearBase class name holds "Linear"; the passes only ask for the substring


def group_algorithm(group: dict, default_format: object, where: str) -> str:
    """The ModelOpt-style name of one config group's scheme, by its real fields, or the one-line refusal.

    `nvfp4-pack-quantized` 4-bit float weights in groups of 16: NVFP4, or W4A16_NVFP4 without input_activations;
    `float-quantized` 8-bit float weights: FP8 per tensor with input activations (W8A8), or FP8_BLOCK in 128x128 blocks
    (DeepSeek's layout)."""
    fmt = group.get("format") or default_format
    weights = group.get("weights") if isinstance(group.get("weights"), dict) else {}
    bits, kind, strategy = weights.get("num_bits"), weights.get("type"), weights.get("strategy")
    if fmt == NVFP4_FORMAT and (bits, kind, weights.get("group_size")) == (4, "float", 16):
        return "NVFP4" if group.get("input_activations") else "W4A16_NVFP4"
    if fmt == FP8_FORMAT and (bits, kind) == (8, "float"):
        if strategy == "tensor" and isinstance(group.get("input_activations"), dict):
            return "FP8"  # W8A8; weights alone (W8A16) build another scheme: no input_scale, not refused under 2:4
        if strategy == "tensor":
            raise BadInput(f"{where}: FP8 per-tensor weights without input_activations (weight-only FP8) are not "
                           "supported; this tool reads FP8 per tensor with its input activations (W8A8)")
        if strategy == "block" and weights.get("block_structure") == [128, 128]:
            return FP8_BLOCK
    raise BadInput(f"{where}: format {repr(fmt)[:80]} with {repr(bits)[:20]}-bit {repr(kind)[:20]} weights ({repr(strategy)[:20]}) "
                   "is not supported; this tool reads "
                   f"config groups of {NVFP4_FORMAT} (NVFP4, 16-element groups) and {FP8_FORMAT} (FP8 per tensor or "
                   "128x128 blocks)")


@dataclass(frozen=True)
class FirstMatch:
    """The first of a list of `re:` patterns (re.match) matching a name, in O(log n) RegexSet calls: one set per node
    of a halving tree over the list (n log n patterns compiled once), so a hostile config's 10^4 targets stay fast."""

    positions: tuple[int, ...]  # each pattern's position in the flattened target list
    sets: dict  # (lo, hi) -> RegexSet over patterns[lo:hi]

    @classmethod
    def compile(cls, patterns: list[str], positions: list[int], where: object) -> "FirstMatch":
        sets, spans = {}, [(0, len(patterns))] if patterns else []
        while spans:
            lo, hi = spans.pop()
            sets[(lo, hi)] = RegexSet.compile(patterns[lo:hi], MATCH, where)
            if hi - lo > 1:
                spans += [(lo, (lo + hi) // 2), ((lo + hi) // 2, hi)]
        return cls(tuple(positions), sets)

    def first(self, name: str) -> int | None:
        lo, hi = 0, len(self.positions)
        if not hi or not self.sets[(lo, hi)].matches(name):
            return None
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.sets[(lo, mid)].matches(name) else (mid, hi)
        return self.positions[lo]


@dataclass(frozen=True)
class GroupSchemes:
    """The flattened target map, (target, algorithm) in map order, with each target compiled once."""

    targets: tuple[tuple[str, str], ...]
    order: tuple[str, ...] = ORDERS["vllm"]
    _regexes: FirstMatch | None = None
    _exact: dict = field(default_factory=dict)  # plain target -> its first position
    config_format: str | None = None  # the top-level `format` (compressed-tensors': `mixed-precision` when groups differ)

    @classmethod
    def from_groups(cls, groups: Mapping[str, dict], algos: Mapping[str, str], where: object,
                    config_format: str | None = None) -> "GroupSchemes":
        flat: dict[str, str] = {}
        for name, group in groups.items():
            for target in group.get("targets") or ():
                flat[target] = algos[name]  # re-assigning keeps the first position, as a Python dict does in vLLM
        listed = list(flat)
        found = [(i, t[3:]) for i, t in enumerate(listed) if t.startswith("re:")]
        regexes = FirstMatch.compile([p for _, p in found], [i for i, _ in found], where)
        exact = {t: i for i, t in reversed(list(enumerate(listed))) if not t.startswith("re:")}
        return cls(tuple(flat.items()), ORDERS["vllm"], regexes, exact, config_format if isinstance(config_format, str) else None)

    def ordered(self, order: tuple[str, ...]) -> "GroupSchemes":
        """The same map tried in another runtime's pass order."""
        return replace(self, order=tuple(order))

    def _by_name(self, name: str) -> int | None:
        found = [i for i in (self._exact.get(name), self._regexes.first(name)) if i is not None]
        return min(found) if found else None

    def _by_fused(self, prefix: str, packed: Mapping[str, tuple[str, ...]]) -> int | None:
        fused = next((k for k in packed if prefix.endswith(k)), None)
        if fused is None:
            return None
        found = [self._by_name(prefix.replace(fused, shard)) for shard in packed[fused]]
        return found[0] if found and all(i is not None for i in found) else None

    def _by_class(self, layer_class: str) -> int | None:
        """The class pass (utils.py `_is_equal_or_regex_match(..., check_contains=True)`): a plain target as a
        case-blind substring of the class name, a `re:` one re.match'ed on it."""
        found = [next((i for i, (t, _) in enumerate(self.targets)
                       if not t.startswith("re:") and t.lower() in layer_class.lower()), None),
                 self._regexes.first(layer_class)]
        return min((i for i in found if i is not None), default=None)

    def matched(self, prefix: str, packed: Mapping[str, tuple[str, ...]] | None = None,
                layer_class: str = LINEAR_CLASS) -> tuple[str, str] | None:
        """(target, algorithm) whose scheme the linear layer `prefix` gets (None: no target matches it)."""
        passes = {"name": lambda: self._by_name(prefix), "fused": lambda: self._by_fused(prefix, packed or {}),
                  "class": lambda: self._by_class(layer_class)}
        for step in self.order:
            found = passes[step]()
            if found is not None:
                return self.targets[found]
        return None

    def resolve(self, prefix: str, packed: Mapping[str, tuple[str, ...]] | None = None) -> str | None:
        """The algorithm of the first matching target (None: built unquantized)."""
        found = self.matched(prefix, packed)
        return None if found is None else found[1]

    @property
    def algorithms(self) -> frozenset[str]:
        return frozenset(a for _, a in self.targets)


@dataclass(frozen=True)
class Sparsity:
    """A compressed-tensors `sparsity_config`: its structure ("2:4") and compression format, and the layers it targets:
    its targets less its ignore list (SGLang's get_linear_scheme removes the ignored entries from the targets, then
    asks find_matched_target: a layer is sparse when any target matches it by any pass, so one compiled set serves)."""

    structure: str | None
    format: str | None
    names: object  # the targets compiled (compressed_tensors.Entries: equal, or `re:` under re.match)
    by_class: bool  # the class pass matches (the same for every Linear here: LINEAR_CLASS)
    targeted: bool = False  # its targets list, as written, names something (vLLM refuses any such config while reading it)

    def covers(self, prefix: str, packed: Mapping[str, tuple[str, ...]] | None = None) -> bool:
        """find_matched_target's passes: by name, by class name, or by every shard of a fused layer."""
        packed = packed or {}
        fused = next((k for k in packed if prefix.endswith(k)), None)
        shards = packed[fused] if fused is not None else ()
        return self.by_class or self.names.matches(prefix) or (
            bool(shards) and all(self.names.matches(prefix.replace(fused, s)) for s in shards))
