"""Tensor-parallel plans that respect NVFP4 quantization groups (pure values; torch is never imported).

Splitting a packed NVFP4 weight is not splitting a matrix: its stored input dim is in/2 bytes
and its block scales in/16, so a row-parallel split cuts the bytes at in/(2·tp) and the scales
at in/(16·tp), and every rank's input width must stay a multiple of the 16-element group.
Global scales (weight_scale_2, input_scale) are replicated; the divisibility rules are the runtime's
(repair/targets/tp_rules.py). Styles come from the architecture's loader profile (vLLM's layer kinds
for the Gemma 4 assistant), else from a transformers `base_model_tp_plan`,
else every tensor is replicated and the plan says so.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field
from typing import Iterable

from repair import arch
from repair.arch.base import Architecture
from repair.arch.tp_plans import TRANSFORMERS_TP_PLANS, TRANSFORMERS_TP_STYLES
from repair.errors import UsageError
from repair.formats.modules import split_name
from repair.planning import check as plan_check
from repair.planning.build import refuse_rank_files
from repair.planning.built import built_families
from repair.planning.model import Plan, TensorStep
from repair.targets.tp_rules import (  # noqa: F401 (BLOCK, VOCAB_PADDING: the writer's units)
    BLOCK, HEAD_ROLES, SPLIT_STYLES, VOCAB_PADDING, ParallelSpec, RankRange, check_degree, check_ranks, heads_of,
)
from repair.tp.check import check_tp_plan
from repair.tp.manifest import MANIFEST

GLOBAL_SCALES = ("weight_scale_2", "input_scale")


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


def style_plan(config: dict | None, where: str = "config.json", family: Architecture | None = None) -> StylePlan:
    """The profile's layer kinds when the architecture is known (`family`: the row of the class the target builds;
    default the newest vLLM release's), else a transformers TP plan, else replicate."""
    family = family or arch.architecture(config)
    specs = arch.expected_modules(config, where, family)
    if specs:
        heads = heads_of(config)
        return StylePlan(f"vLLM layer kinds for the {family.name} (profile)",
                         {n: family.layer_kinds[s.role].style for n, s in specs.items()}, (),
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
    if style != "row":  # transformers' ColwiseParallel: Shard(ndim - 2), a 3-D experts tensor's rows, not its experts
        dim = 0 if style == "vocab" else max(len(t.shape) - 2, 0)
        return ParallelSpec(t.name, style, dim, t.shape[dim], 1, heads)
    if leaf not in ("weight", "weight_scale") or len(t.shape) < 2:
        return ParallelSpec(t.name, "replicated")  # a row-parallel bias is added once, after the reduce
    is_packed = module in packed
    unit = (2 if leaf == "weight" else BLOCK) if is_packed else 1
    dim = len(t.shape) - 1
    return ParallelSpec(t.name, "row", dim, t.shape[dim] * unit, unit, heads, is_packed)


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
    InternalError when the plan (any Plan may be passed in, edited or built by hand) or the split layout
    fails its check."""
    plan_check.check_plan(plan)
    reason = plan.format.unsupported("tp")
    if reason:
        raise UsageError(f"{plan.source.root}: {reason}")
    refuse_rank_files(plan.source)  # a Plan built by hand (Python API) is checked too
    check_ranks(tp, f"the most `unshard` reads back from {MANIFEST}")
    steps = [(s.name, t) for s in plan.shards for t in s.tensors]
    styles = _target_styles(plan)
    specs = tensor_specs([t.out for _, t in steps], styles)
    _refuse_split_pre_quant_scale(plan, specs)
    check_degree(specs, tp)
    tpp = TpPlan(plan, tp, tuple(TpTensor(shard, step, spec) for (shard, step), spec in zip(steps, specs)), styles.source)
    check_tp_plan(tpp)
    return tpp


def _target_styles(plan: Plan) -> StylePlan:
    """How the plan's targets split the output: the layer kinds of the class each one's release builds (doctor's
    decision, carried by the plan's verdicts); targets that split it differently cannot share one rank layout."""
    where = str(plan.source.root / "config.json")
    found: list[StylePlan] = []
    for family in built_families(plan.source, plan.before):
        styles = style_plan(plan.source.config, where, family)
        if found and _splits(styles) != _splits(found[0]):  # its source names the row: alike splits serve both
            raise UsageError(f"{plan.source.root}: the targets build different classes of this model and split its tensors "
                             f"differently ({found[0].source}; {styles.source}), so no one --tp layout serves them all; nothing "
                             "was written; run fix --tp once per target")
        found.append(styles)
    return found[0]


def _splits(styles: StylePlan) -> tuple:
    """What decides each tensor's split (not where the styles came from)."""
    return styles.modules, styles.patterns, styles.heads


def _refuse_split_pre_quant_scale(plan: Plan, specs) -> None:
    """A kept NVFP4_AWQ layer split by input columns needs its pre_quant_scale [in] split with it, which this
    layout does not do yet: refused rather than written wrong."""
    split = {spec.tensor.rpartition(".")[0] for spec in specs if spec.dim == 1 and spec.tensor.endswith(".weight")}
    kept = sorted(spec.tensor for spec in specs if spec.tensor.endswith(".pre_quant_scale") and spec.tensor.rpartition(".")[0] in split)
    if kept:
        raise UsageError(f"{plan.source.root}: --tp does not split NVFP4_AWQ pre_quant_scale yet ({kept[0]}, ...); dequantize those "
                         "layers (a recipe rule with algorithm = \"NVFP4_AWQ\") or run without --tp")


def summary_text(tpp: TpPlan) -> str:
    counts = tpp.counts()
    split = ", ".join(f"{counts[s]} {s}" for s in SPLIT_STYLES if counts.get(s))
    return (f"tensor parallel {tpp.tp} ({tpp.source}): {sum(counts.get(s, 0) for s in SPLIT_STYLES)} tensor(s) split"
            f"{' (' + split + ')' if split else ''}, {counts.get('replicated', 0)} replicated")
