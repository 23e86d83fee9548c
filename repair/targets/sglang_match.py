"""SGLang's rules for which layers a config's lists leave unquantized, release by release, as functions of the data.

Derived from the SGLang wheels on PyPI (0.5.9 to 0.5.23; repair/targets/data/sglang-*.json name
the files): `ModelOptQuantConfig.is_layer_excluded` and `is_layer_skipped` (layers/quantization/modelopt_quant.py,
utils.py), `should_ignore_layer` (quantization/compressed_tensors/utils.py) and
`ModelOptMixedPrecisionConfig._resolve_quant_algo`. A rule is asked with checkpoint-side runtime names (a shard
`...q_proj`, one expert's `...experts.3.up_proj`) and answers for the layer SGLang builds them into: the fused
`...qkv_proj` (asked through is_layer_skipped and is_layer_excluded) or the FusedMoE `...experts` (is_layer_excluded
only). Where SGLang raises while building the layer, `fused_refusal` gives its text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from repair.formats.algorithms import LayerAlgorithms
from repair.io.patterns import FULLMATCH, MATCH, RegexSet

FALLBACK_FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}  # utils.py, 0.5.11+
MLA_FUSED_PARTS = frozenset({"q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj"})  # is_layer_excluded's special case
SKIP_MIX = ("ValueError: Detected some but not all shards of {prefix} are quantized. All shards of fused layers "
            "to have the same precision.")
CT_MIX = ("ValueError: Found different quantization schemes for {shards} in {prefix}. SGLang requires all to use the "
          "same scheme.")
Packed = Mapping[str, tuple[str, ...]]
LINEAR_CLASSES = ("RowParallelLinear", "ColumnParallelLinear", "MergedColumnParallelLinear", "QKVParallelLinear",
                  "ReplicatedLinear")  # a plain target contained in the class name matches (check_contains)


@dataclass(frozen=True)
class Building:
    """How one SGLang release builds a model's layers: the model code's fusions (always fused, whatever the config),
    the model class's `packed_modules_mapping` (what the quant config is told), and the release's flags."""

    fusions: Packed  # layer -> shards the model code fuses (qkv_proj from q/k/v)
    packed: Packed  # the model class's packed_modules_mapping
    fallback: bool = False  # is_layer_skipped falls back to qkv_proj/gate_up_proj shards (0.5.11+)
    own: tuple[str, ...] = ()  # module suffixes the model builds as their own layer though their leaf names a fused
    # shard, so no fused layer at their parent (TensorRT-LLM's Afmoe `self_attn.gate_proj`: no attention gate_up_proj)

    def built_layer(self, name: str) -> tuple[str, str]:
        """(the layer SGLang builds `name` into, its kind: "linear", "fused" or "moe")."""
        cut = name.find(".experts.")
        if cut >= 0 and name[cut + 9:].split(".", 1)[0].isdigit():
            return name[: cut + len(".experts")], "moe"
        parent, _, leaf = name.rpartition(".")
        fused = next((f for f, shards in self.fusions.items() if leaf in shards), None)
        if fused and self.own and any(self._own(f"{parent}.{s}") for s in self.fusions[fused]):
            return name, "linear"  # one shard is a layer of its own there: the model builds no such fused layer
        return (f"{parent}.{fused}" if parent else fused, "fused") if fused else (name, "linear")

    def _own(self, name: str) -> bool:
        return any(name == s or name.endswith("." + s) for s in self.own)

    def shards_of(self, prefix: str) -> tuple[str, tuple[str, ...]] | None:
        """(leaf, shard leaves) when is_layer_skipped treats `prefix` as fused (its mapping, else the fallback)."""
        leaf = prefix.rpartition(".")[2]
        mapping = self.packed if leaf in self.packed else (FALLBACK_FUSED if self.fallback else {})
        return (leaf, tuple(mapping[leaf])) if leaf in mapping else None


@dataclass(frozen=True)
class ExcludedGlobs:
    """is_layer_excluded: each entry as a regex (`.` escaped, `*` -> `.*`, nothing else), fullmatched against the
    prefix, the prefix without `language_model.`, and each of their dotted parts; plus the MLA fused-name case."""

    globs: RegexSet
    mla_tails: frozenset[str]
    _seen: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # name or part -> fullmatched

    @classmethod
    def compile(cls, entries: tuple[str, ...]) -> "ExcludedGlobs":
        regexes = [e.replace(".", r"\.").replace("*", ".*") for e in entries]
        tails = frozenset(t for e in entries if (t := e.rsplit(".", 1)[-1]) in MLA_FUSED_PARTS)
        return cls(RegexSet.compile(regexes, FULLMATCH, "exclusion entry (as SGLang turns it into a regex)"), tails)

    def __call__(self, prefix: str) -> bool:
        variants = [prefix] + ([prefix[len("language_model."):]] if prefix.startswith("language_model.") else [])
        for v in variants:
            if any(self._match(c) for c in [v, *v.split(".")]):
                return True
        return any(t in v.rsplit(".", 1)[-1] for t in self.mla_tails for v in variants)

    def _match(self, text: str) -> bool:
        """One fullmatch question; a checkpoint's names repeat their parts (layers, 0, self_attn), so asked once each."""
        found = self._seen.get(text)
        if found is None:
            found = self._seen[text] = self.globs.matches(text)
        return found


@dataclass(frozen=True)
class SkippedList:
    """is_layer_skipped: `dotted` (0.5.11+: equal, an ancestor, or a dotted run inside) or substring (<= 0.5.10);
    `experts_or` (0.5.10+) keeps the plain match for a prefix naming experts, 0.5.9 replaces it; `strip` (0.5.13+)
    drops a trailing `.` from entry and prefix first (0.5.11/0.5.12 compare them as written)."""

    entries: tuple[str, ...]
    dotted: bool
    experts_or: bool
    strip: bool = True
    stripped: frozenset[str] = field(init=False)
    _seen: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # prefix -> listed

    def __post_init__(self) -> None:
        object.__setattr__(self, "stripped", frozenset(e.rstrip(".") if self.strip else e for e in self.entries))

    def listed(self, prefix: str) -> bool:
        found = self._seen.get(prefix)
        if found is None:
            found = self._seen[prefix] = self._listed(prefix)
        return found

    def _listed(self, prefix: str) -> bool:
        if not self.dotted:
            return any(e in prefix for e in self.entries)
        name = prefix.rstrip(".") if self.strip else prefix
        if len(self.stripped) <= 16:  # _module_path_match itself, entry by entry (one entry: the unused-entry question)
            dotted = f".{name}."
            return any(name == e or name.startswith(e + ".") or f".{e}." in dotted for e in self.stripped)
        parts = name.split(".")  # many entries: every dotted run of the name, looked up
        return any(".".join(parts[i:j]) in self.stripped for i in range(len(parts)) for j in range(i + 1, len(parts) + 1))

    def skipped(self, prefix: str, building: Building) -> tuple[bool, str | None]:
        """(skipped, SGLang's error when the fused layer's listed shards disagree)."""
        fused = building.shards_of(prefix)
        if fused is not None:
            leaf, shards = fused
            states = {self.listed(prefix.replace(leaf, s)) for s in shards}
            return (states.pop(), None) if len(states) == 1 else (False, SKIP_MIX.format(prefix=prefix))
        found = self.listed(prefix)
        if "gate_up_proj" in prefix:
            both = {prefix.replace("gate_up_proj", "gate_proj"), prefix.replace("gate_up_proj", "up_proj")}
            found = found or both <= set(self.entries)
        elif "experts" in prefix:
            named = any(prefix in e for e in self.entries if "experts" in e)
            found = (found or named) if self.experts_or else named
        return found, None


@dataclass(frozen=True)
class SglangModelOptRule:
    """A Linear is BF16 when is_layer_skipped or is_layer_excluded says so; a FusedMoE only by is_layer_excluded."""

    skipped: SkippedList
    excluded: ExcludedGlobs
    building: Building

    def _decide(self, name: str) -> tuple[bool, str | None]:
        layer, kind = self.building.built_layer(name)
        if kind == "moe":
            return self.excluded(layer), None
        skipped, error = self.skipped.skipped(layer, self.building)
        return (skipped or (error is None and self.excluded(layer))), error

    def excludes(self, prefix: str) -> bool:
        return self._decide(prefix)[0]

    def shard_excluded(self, prefix: str) -> bool:
        """is_layer_skipped's test of one shard name (the list names it), as the fused-layer check asks it."""
        return self.skipped.listed(prefix)

    def names(self, prefix: str) -> bool:
        """Whether the entries name this checkpoint module the way SGLang applies them: a fused layer's shard only
        through is_layer_skipped's per-shard test (no wildcards), an expert only through its FusedMoE's globs (the
        layer asks is_layer_excluded with `...mlp.experts`, never an expert's name: a per-expert entry reaches none)."""
        layer, kind = self.building.built_layer(prefix)
        if kind == "fused":
            return self.skipped.listed(prefix)
        if kind == "moe":
            return self.excluded(layer)
        return self.skipped.listed(prefix) or self.excluded(prefix)

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        """The error SGLang raises building the layer the shards are fused into, or None."""
        return self._decide(shards[0] if shards else fused)[1]


@dataclass(frozen=True)
class CtTargets:
    """A compressed-tensors config's group targets (None: every Linear), `re:` ones compiled once: a bound declaration
    keeps them, and every rule it builds over another ignore list (entry by entry, for unused entries) shares them."""

    listed: tuple[str, ...] | None
    regexes: RegexSet | None

    @classmethod
    def compile(cls, targets) -> "CtTargets":
        if targets is None:
            return cls(None, None)
        listed = tuple(targets)
        return cls(listed, RegexSet.compile([t[3:] for t in listed if t.startswith("re:")], MATCH, "compressed-tensors config-group target"))


@dataclass(frozen=True)
class SglangCtRule:
    """should_ignore_layer: a plain entry is a case-insensitive substring (<= 0.5.16) or the name or a dotted suffix
    (0.5.17+); `re:` entries re.match. A fused layer not itself listed takes its shards' answer, which must agree.
    A layer not ignored needs a config-group target (find_matched_target: its name, its class name, or every shard),
    else SGLang stops building the model."""

    ignore: tuple[str, ...]
    suffix: bool
    building: Building
    regexes: RegexSet
    targets: tuple[str, ...] | None = None  # None: every Linear is a target
    target_regexes: RegexSet | None = None

    def _listed(self, name: str) -> bool:
        if self.regexes.matches(name):
            return True
        plain = [e for e in self.ignore if not e.startswith("re:")]
        if self.suffix:
            return any(e == name or name.endswith("." + e) for e in plain)
        return any(e.lower() in name.lower() for e in plain)

    def _targeted(self, name: str) -> bool:
        return name in self.targets or self.target_regexes.matches(name)

    def _untargeted(self, layer: str) -> str | None:
        """find_matched_target's ValueError for a layer no target names, else None."""
        if self.targets is None or any(not t.startswith("re:") and t in c for t in self.targets for c in LINEAR_CLASSES):
            return None
        if layer.rpartition(".")[2] == "lm_head":
            return None  # a ParallelLMHead asks get_lm_head_scheme, which builds an unmatched head unquantized (0.5.23)
        if self._targeted(layer):
            return None
        fused = next((k for k in self.building.packed if layer.endswith(k)), None)
        if fused is not None and all(self._targeted(layer.replace(fused, s)) for s in self.building.packed[fused]):
            return None
        return f"ValueError: Unable to find matching target for {layer} in the compressed-tensors config."

    def _decide(self, name: str) -> tuple[bool, str | None]:
        layer, kind = self.building.built_layer(name)
        leaf = layer.rpartition(".")[2]
        shards = self.building.packed.get(leaf)
        if kind == "moe" or shards is None or layer in self.ignore:
            ignored = self._listed(layer)
        else:
            states = {self._listed(layer.replace(leaf, s)) for s in shards}
            if len(states) > 1:
                return False, CT_MIX.format(shards=list(shards), prefix=layer)
            ignored = states.pop()
        # get_moe_scheme asks for the FusedMoE layer's first expert's projections (`experts.0.gate_proj`)
        return ignored, None if ignored else self._untargeted(f"{layer}.0.gate_proj" if kind == "moe" else layer)

    def excludes(self, prefix: str) -> bool:
        return self._decide(prefix)[0]

    def shard_excluded(self, prefix: str) -> bool:
        return self._listed(prefix)

    def names(self, prefix: str) -> bool:
        return self._listed(prefix)

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        return self._decide(shards[0] if shards else fused)[1]


# _quantized_layer_prefix_candidates' prefix swaps, by release: 0.5.15-0.5.19 swap the two VL spellings of the text
# stack (0.5.15 modelopt_quant.py); 0.5.20+ also try `model.` as `model.language_model.` and back (0.5.20, 0.5.23)
LANGUAGE_SWAPS = (("language_model.model.", ("model.language_model.",)), ("model.language_model.", ("language_model.model.",)))
ALIAS_SWAPS = (("language_model.model.", ("model.language_model.",)),
               ("model.language_model.", ("language_model.model.", "model.")), ("model.", ("model.language_model.",)))


def layer_candidates(prefix: str, swaps: tuple) -> tuple[str, ...]:
    """_quantized_layer_prefix_candidates (0.5.15+; before it the prefix alone: no `swaps`)."""
    out = [prefix]
    if swaps:
        if prefix.endswith(".lm_head"):
            out.append("lm_head")
        for old, new in swaps:
            if prefix.startswith(old):
                out += [n + prefix[len(old):] for n in new]
                break
    return tuple(dict.fromkeys(out))


def resolve_layer(layers: LayerAlgorithms, name: str, building: Building, aliases: tuple) -> tuple[str | None, str | None]:
    """(algorithm, SGLang's error) for the layer `name` is built into, in _resolve_quant_algo's order: a candidate
    key; a packed layer's shard keys (which must agree); the first key under a candidate (file order)."""
    prefix, _ = building.built_layer(name)
    for c in layer_candidates(prefix, aliases):
        if (found := layers.entry(c)) is not None:
            return found.upper(), None
    base, _, leaf = prefix.rpartition(".")
    if leaf in building.packed:
        algos = {a.upper() for b in layer_candidates(base, aliases) for s in building.packed[leaf]
                 if (a := layers.entry(f"{b}.{s}")) is not None}
        if len(algos) > 1:
            return None, (f"ValueError: Mixed quant_algo within fused layer {prefix}: {algos}. All shards must use the "
                          "same quantization.")
        if algos:
            return algos.pop(), None
    for c in layer_candidates(prefix, aliases):
        if (found := layers.first_under(c)) is not None:
            return found.upper(), None
    return None, None
