"""Tensor-parallel plans that respect NVFP4 quantization groups (pure values; torch is never imported).

Splitting a packed NVFP4 weight is not splitting a matrix: its stored input dim is in/2 bytes
and its block scales in/16, so a row-parallel split cuts the bytes at in/(2·tp) and the scales
at in/(16·tp), and every rank's input width must stay a multiple of the 16-element group.
Global scales (weight_scale_2, input_scale) are replicated. Styles come from the target profile
(vLLM's layer kinds for the Gemma 4 assistant), else from a transformers `base_model_tp_plan`,
else every tensor is replicated and the plan says so.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Iterable

from repair import arch, formats
from repair.errors import UsageError
from repair.formats.modules import split_name
from repair.planning.model import Plan, TensorStep
from repair.targets.profiles import GEMMA4_ASSISTANT_LAYERS, TRANSFORMERS_TP_PLANS, TRANSFORMERS_TP_STYLES
from repair.tp.check import check_tp_plan

BLOCK = 16  # NVFP4 group: logical elements per fp8 block scale
VOCAB_PADDING = 64  # vLLM's DEFAULT_VOCAB_PADDING_SIZE
MAX_DEGREE = 128  # degrees tried when listing the ones that work
GLOBAL_SCALES = ("weight_scale_2", "input_scale")
SPLIT_STYLES = ("column", "row", "merged", "vocab")
HEAD_ROLES = ("q_proj", "o_proj")
NVFP4_IN_FEATURES = "ValueError: Unsupported model when in features size is not multiple of 16"


@dataclass(frozen=True)
class RankRange:
    """One rank's part of the split dim, [start, end), in logical elements and in stored elements."""

    logical: tuple[int, int]
    stored: tuple[int, int]


@dataclass(frozen=True)
class Problem:
    """Why a degree is impossible for one tensor, with the runtime's own error where it has one."""

    tensor: str
    rule: str
    runtime_error: str | None = None


def padded_vocab(size: int) -> int:
    return -(-size // VOCAB_PADDING) * VOCAB_PADDING


@dataclass(frozen=True)
class ParallelSpec:
    """How one tensor is split across ranks: style, stored dim, the dim's logical length and stored unit."""

    tensor: str
    style: str  # column | row | merged | vocab | replicated
    dim: int | None = None  # stored dim that is split; None when replicated
    size: int = 0  # logical length of `dim` (full-precision elements)
    unit: int = 1  # logical elements per stored element along `dim`: 2 for packed bytes, 16 for block scales
    heads: int | None = None  # attention heads that must divide evenly
    blocked: bool = False  # NVFP4 on the input dim: each rank's logical width must be a multiple of 16

    def ranges(self, tp: int) -> tuple[RankRange, ...]:
        """Every rank's range; vocab ranks follow vLLM (padded rows are not stored, so the last may be short)."""
        if self.dim is None:
            return ()
        per = (padded_vocab(self.size) if self.style == "vocab" else self.size) // tp
        bounds = [(min(r * per, self.size), min((r + 1) * per, self.size)) for r in range(tp)]
        return tuple(RankRange((a, b), (a // self.unit, b // self.unit)) for a, b in bounds)

    def problem(self, tp: int) -> Problem | None:
        """The first rule this degree breaks for this tensor, or None."""
        if self.dim is None:
            return None
        if self.style == "vocab":
            padded = padded_vocab(self.size)
            if padded % tp:
                return Problem(self.tensor, f"vocab-parallel: the vocabulary ({self.size}, padded to {padded}, a multiple of "
                               f"{VOCAB_PADDING} as vLLM pads it) is not divisible by {tp}", f"AssertionError: {padded} is not divisible by {tp}")
            return None
        what = "input features" if self.style == "row" else "output features"
        if self.size % tp:
            total = 2 * self.size if self.style == "merged" and (2 * self.size) % tp else self.size  # vLLM divides gate+up first
            return Problem(self.tensor, f"{self.style}-parallel: its {self.size} {what} are not divisible by {tp}",
                           f"AssertionError: {total} is not divisible by {tp}")
        if self.heads and self.heads % tp:
            return Problem(self.tensor, f"its {self.heads} attention heads are not divisible by {tp}")
        if self.blocked and (self.size // tp) % BLOCK:
            return Problem(self.tensor, f"row-parallel NVFP4: each rank's input features ({self.size}/{tp} = {self.size // tp}) "
                           f"must be a multiple of {BLOCK}, the quantization group", NVFP4_IN_FEATURES)
        return None


def problems(specs: Iterable[ParallelSpec], tp: int) -> list[Problem]:
    return [p for s in specs if (p := s.problem(tp)) is not None]


def valid_degrees(specs: Iterable[ParallelSpec], limit: int = MAX_DEGREE) -> list[int]:
    specs = list(specs)
    return [d for d in range(1, limit + 1) if not problems(specs, d)]


def degrees_text(degrees: list[int]) -> str:
    return ", ".join(map(str, degrees)) + f" (of 1-{MAX_DEGREE})" if degrees != [1] else "only 1 (no tensor parallelism)"


def check_degree(specs: Iterable[ParallelSpec], tp: int) -> None:
    """Raise UsageError naming the tensor and the rule when `tp` is impossible, with the degrees that work."""
    specs = list(specs)
    if tp < 1:
        raise UsageError(f"--tp {tp}: the tensor-parallel degree must be at least 1")
    found = sorted(problems(specs, tp), key=lambda p: (split_name(p.tensor)[0], not p.tensor.endswith(".weight"), p.tensor))
    if found:
        first = found[0]
        more = f" (and {len(found) - 1} more tensor(s))" if len(found) > 1 else ""
        raise UsageError(f"--tp {tp} is impossible: {first.tensor}: {first.rule}{more}; "
                         f"degrees that work for this checkpoint: {degrees_text(valid_degrees(specs))}")


@dataclass(frozen=True)
class StylePlan:
    """Where each module's parallel style comes from: a profile's layer kinds, or a transformers TP plan."""

    source: str
    modules: dict[str, str] = field(default_factory=dict)  # exact module (or tensor) name -> style
    patterns: tuple[tuple[str, str], ...] = ()  # (tp-plan key, style), matched below the base model
    heads: dict[str, int] = field(default_factory=dict)

    def style(self, module: str, tensor: str) -> str:
        found = self.modules.get(module) or self.modules.get(tensor)
        if found:
            return found
        parts = module.split(".")
        for pattern, style in self.patterns:
            if any(fnmatch.fnmatchcase(".".join(parts[i:]), pattern) for i in range(len(parts))):
                return style
        return "replicated"


def style_plan(config: dict | None, where: str = "config.json") -> StylePlan:
    """The profile's layer kinds when the architecture is known, else a transformers TP plan, else replicate."""
    specs = arch.expected_modules(config, where)
    if specs:
        heads = _heads(config)
        return StylePlan("vLLM layer kinds for the Gemma 4 assistant (profile)",
                         {n: GEMMA4_ASSISTANT_LAYERS[s.role].style for n, s in specs.items()}, (),
                         {n: heads for n, s in specs.items() if s.role in HEAD_ROLES and heads})
    plan, source = _tp_plan(config or {})
    if plan is not None:
        return StylePlan(source, {}, tuple((k, TRANSFORMERS_TP_STYLES.get(v, "replicated")) for k, v in plan.items()))
    model_type = (config or {}).get("model_type")
    return StylePlan(f"no parallel plan known for model_type {model_type!r}: every tensor is replicated")


def _tp_plan(config: dict) -> tuple[dict | None, str]:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    for section in (config, text):
        if isinstance(section.get("base_model_tp_plan"), dict):
            return section["base_model_tp_plan"], "transformers base_model_tp_plan from config.json"
    for model_type in (config.get("model_type"), text.get("model_type")):
        if model_type in TRANSFORMERS_TP_PLANS:
            return TRANSFORMERS_TP_PLANS[model_type], f"transformers base_model_tp_plan of {model_type}"
    return None, ""


def _heads(config: dict | None) -> int | None:
    text = (config or {}).get("text_config")
    value = (text if isinstance(text, dict) else config or {}).get("num_attention_heads")
    return value if type(value) is int and value > 0 else None


def tensor_specs(tensors: Iterable, styles: StylePlan) -> tuple[ParallelSpec, ...]:
    """A ParallelSpec for every stored tensor (objects with name, dtype, shape)."""
    tensors = list(tensors)
    dtypes = {t.name: t.dtype for t in tensors}
    packed = {split_name(t.name)[0] for t in tensors
              if t.name.endswith(".weight") and t.dtype == "U8" and dtypes.get(t.name[: -len("weight")] + "weight_scale") == "F8_E4M3"}
    return tuple(_spec(t, styles, packed) for t in tensors)


def _spec(t, styles: StylePlan, packed: set[str]) -> ParallelSpec:
    module, leaf = split_name(t.name)
    style = styles.style(module, t.name)
    if style not in SPLIT_STYLES or leaf in GLOBAL_SCALES or not t.shape:
        return ParallelSpec(t.name, "replicated")
    heads = styles.heads.get(module)
    if style != "row":
        return ParallelSpec(t.name, style, 0, t.shape[0], 1, heads)
    if leaf not in ("weight", "weight_scale") or len(t.shape) < 2:
        return ParallelSpec(t.name, "replicated")  # a row-parallel bias is added once, after the reduce
    is_packed = module in packed
    unit = (2 if leaf == "weight" else BLOCK) if is_packed else 1
    dim = len(t.shape) - 1
    return ParallelSpec(t.name, "row", dim, t.shape[dim] * unit, unit, heads, is_packed)


def runtime_specs(specs: dict, precision: dict[str, str], config: dict | None) -> tuple[ParallelSpec, ...]:
    """What the runtime splits, per module, as it builds it (NVFP4 or BF16): for doctor's degree check."""
    heads = _heads(config)
    out = []
    for spec in specs.values():
        style = GEMMA4_ASSISTANT_LAYERS[spec.role].style
        if style not in SPLIT_STYLES or len(spec.shape) != 2:
            continue
        h = heads if spec.role in HEAD_ROLES else None
        if style == "row":
            out.append(ParallelSpec(spec.name, "row", 1, spec.shape[1], 1, h, precision.get(spec.name) == "nvfp4"))
        else:
            out.append(ParallelSpec(spec.name, style, 0, spec.shape[0], 1, h))
    return tuple(out)


@dataclass(frozen=True)
class TpTensor:
    """One tensor of the standard output: the shard it belongs to, how it is produced, how it is split."""

    shard: str
    step: TensorStep
    spec: ParallelSpec

    def rank_shape(self, rng: RankRange | None) -> tuple[int, ...]:
        shape = list(self.step.out.shape)
        if rng is not None:
            shape[self.spec.dim] = rng.stored[1] - rng.stored[0]
        return tuple(shape)

    def entry(self, tp: int) -> dict:
        """The manifest's record: style, dim, and each rank's range in logical and stored units."""
        s, out = self.spec, self.step.out
        ranges = s.ranges(tp) or (None,) * tp
        return {
            "dtype": out.dtype, "shape": list(out.shape), "style": s.style, "dim": s.dim,
            "logical_size": s.size if s.dim is not None else None, "unit": s.unit if s.dim is not None else None,
            "ranks": [{"logical": list(r.logical) if r else None, "stored": list(r.stored) if r else None,
                       "shape": list(self.rank_shape(r))} for r in ranges],
        }


@dataclass(frozen=True, eq=False)
class TpPlan:
    """A Plan split `tp` ways: every output tensor, in the standard output's order, with its split."""

    plan: Plan
    tp: int
    tensors: tuple[TpTensor, ...]
    source: str  # where the styles came from

    def counts(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for t in self.tensors:
            found[t.spec.style] = found.get(t.spec.style, 0) + 1
        return found


def plan_tp(plan: Plan, tp: int) -> TpPlan:
    """Split a plan's output `tp` ways; raises UsageError (before anything is written) when impossible,
    InternalError when the split layout fails its check."""
    reason = formats.by_name(plan.format).unsupported("tp")
    if reason:
        raise UsageError(f"{plan.source.root}: {reason}")
    steps = [(s.name, t) for s in plan.shards for t in s.tensors]
    styles = style_plan(plan.source.config, str(plan.source.root / "config.json"))
    specs = tensor_specs([t.out for _, t in steps], styles)
    check_degree(specs, tp)
    tpp = TpPlan(plan, tp, tuple(TpTensor(shard, step, spec) for (shard, step), spec in zip(steps, specs)), styles.source)
    check_tp_plan(tpp)
    return tpp


def summary_text(tpp: TpPlan) -> str:
    counts = tpp.counts()
    split = ", ".join(f"{counts[s]} {s}" for s in SPLIT_STYLES if counts.get(s))
    return (f"tensor parallel {tpp.tp} ({tpp.source}): {sum(counts.get(s, 0) for s in SPLIT_STYLES)} tensor(s) split"
            f"{' (' + split + ')' if split else ''}, {counts.get('replicated', 0)} replicated")
