"""What a finding's hint says `fix --target` does, true for the module as stored.

A hint that ends "(fix --target does)" after "dequantize it" names the repair fix --target plans for the finding. It
is false where the module's scales cannot be read: the planner's dequantize refuses such a module (planning/
dequantize.py, formats/nvfp4_packed.check_packed: no weight_scale or weight_scale_2, a misshapen or invalid scale), and
doctor reports that defect on the same module. Such a hint says instead that fix --target refuses it, and that
fix --target with --original takes the module from the original model (Recipe.using_original)."""

from __future__ import annotations

from dataclasses import replace

from repair.doctor.findings import Finding, Kind, Severity

FIX_DOES = "(fix --target does)"
# the defects with which the planner refuses to dequantize a module (each an error doctor reports on it or its scales)
UNREADABLE = frozenset({Kind.MISSING_WEIGHT_SCALE, Kind.MISSING_SCALE_2, Kind.SCALE_SHAPE, Kind.GLOBAL_SCALE,
                        Kind.SCALE_OVERFLOW, Kind.BLOCK_SCALES, Kind.FP8_SCALE, Kind.PRE_QUANT_SCALE})


def true_hints(findings: list[Finding]) -> list[Finding]:
    """`findings` with every hint that fix --target dequantizes a module whose scales cannot be read rewritten."""
    unreadable = {f.subject: f for f in findings if f.code in UNREADABLE and f.severity is Severity.ERROR}
    if not unreadable:
        return findings
    return [_rewritten(f, unreadable) if f.dequantizes and FIX_DOES in f.message else f for f in findings]


def _rewritten(f: Finding, unreadable: dict[str, Finding]) -> Finding:
    defect = next((d for m in f.dequantizes for d in _defects(m, unreadable)), None)
    if defect is None:
        return f
    said = (f"(fix --target refuses it: [{defect.code}] {defect.subject}, so it cannot be dequantized; fix --target with "
            "--original ORIG takes it from the original model instead)")
    return replace(f, message=f.message.replace(FIX_DOES, said))


def _defects(module: str, unreadable: dict[str, Finding]) -> list[Finding]:
    """The unreadable-scale defects doctor found on `module` itself or one of its tensors."""
    return [d for subject, d in unreadable.items() if subject == module or subject.startswith(module + ".")]
