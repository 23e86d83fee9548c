"""What a finding's hint says `fix --target` does, true for the module as stored.

A hint that ends "(fix --target does)" after "dequantize it" or "exclude it" names the repair fix --target plans for
the finding: the module turned BF16 and excluded by its exact name. Two things make fix --target refuse that repair,
and doctor knows both, so such a hint says so instead, with what does work:
- the module's scales cannot be read: the planner's dequantize refuses it (planning/dequantize.py,
  formats/nvfp4_packed.check_packed: no weight_scale or weight_scale_2, a misshapen or invalid scale), and doctor
  reports that defect on the module; fix --target with --original takes it from the original model
  (Recipe.using_original);
- the module's name holds pattern syntax (targets/config_lists.pattern_syntax): no exclusion entry names exactly it
  (planning/runtime_entries.refuse_pattern_names); only renaming the module in the checkpoint does."""

from __future__ import annotations

from dataclasses import replace

from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.modelopt_nvfp4 import LEAVES
from repair.targets.config_lists import pattern_syntax

FIX_DOES = "(fix --target does)"
# the defects with which the planner refuses to dequantize a module (each an error doctor reports on it or its scales)
SCALE_LEAVES = tuple(sorted((leaf for role, leaf in LEAVES.items() if role != "weight"), key=len, reverse=True))
UNREADABLE = frozenset({Kind.MISSING_WEIGHT_SCALE, Kind.MISSING_SCALE_2, Kind.SCALE_SHAPE, Kind.GLOBAL_SCALE,
                        Kind.SCALE_OVERFLOW, Kind.BLOCK_SCALES, Kind.FP8_SCALE, Kind.PRE_QUANT_SCALE})


def true_hints(findings: list[Finding]) -> list[Finding]:
    """`findings` with every hint that fix --target repairs a module it refuses to rewritten."""
    unreadable: dict[str, Finding] = {}  # module -> its first such defect (one on a scale tensor counts for its module)
    for f in findings:
        if f.code in UNREADABLE and f.severity is Severity.ERROR:
            unreadable.setdefault(module_of(f.subject), f)
    return [_rewritten(f, unreadable) if f.repairs and FIX_DOES in f.message else f for f in findings]


def module_of(subject: str) -> str:
    """The module a defect's subject names: itself, the module of its `.weight_scale`-like tensor, or `X` of ModelOpt's
    BMM experts' `X_weight_scale` (formats/nvfp4_packed: the scales sit beside the leafless weight `X`)."""
    parent, _, leaf = subject.rpartition(".")
    beside = next((leaf[: -len(s) - 1] for s in SCALE_LEAVES if leaf.endswith("_" + s) and len(leaf) > len(s) + 1), None)
    if beside and leaf not in SCALE_LEAVES:
        return f"{parent}.{beside}" if parent else beside
    return parent if "scale" in leaf else subject


def _rewritten(f: Finding, unreadable: dict[str, Finding]) -> Finding:
    named = next(((m, found) for m in f.repairs if (found := pattern_syntax(m))), None)
    if named is not None:
        said = (f"(fix --target refuses it: {named[0]!r} holds {named[1]!r}, which runtimes read as pattern syntax in an "
                "exclusion entry, so no entry names exactly it; rename the module in the checkpoint)")
        return replace(f, message=f.message.replace(FIX_DOES, said))
    defect = next((unreadable[m] for m in f.repairs if m in unreadable), None)
    if defect is None:
        return f
    said = (f"(fix --target refuses it: [{defect.code}] {defect.subject}, so it cannot be dequantized; fix --target with "
            "--original ORIG takes it from the original model instead)")
    return replace(f, message=f.message.replace(FIX_DOES, said))
