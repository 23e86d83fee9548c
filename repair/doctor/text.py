"""A diagnosis as text for people and JSON for programs."""

from __future__ import annotations

import shlex

from repair import arch
from repair.doctor.findings import Diagnosis, Severity
from repair.doctor.grouping import finding_lines
from repair.doctor.schemes import scheme_counts
from repair.errors import one_line


def diagnosis_json(d: Diagnosis, strict: bool = False) -> dict:
    return {
        "target": d.target.spec,
        "profile": d.target.profile.name,
        "release_profile": d.target.release.label if d.target.release is not None else None,
        "tp": d.tp,
        "exit_code": d.exit_code(strict),
        "bits_per_parameter": round(d.bits_per_parameter, 4),
        "architecture": d.architecture,
        "checked": checked(d),
        "scale_checks": d.scales.as_dict() if d.scales else None,
        "runtime_stops_at": [{"rank": o.rank, "tensor": o.tensor, "error": o.error} for o in d.first_errors],
        "findings": [
            {"severity": f.severity, "code": f.code, "subject": f.subject, "message": f.message,
             "runtime_error": f.runtime_error, "ranks": list(f.ranks)}
            for f in d.findings
        ],
        "notes": [{"code": f.code, "subject": f.subject, "message": f.message} for f in d.notes],
        "schemes": dict(sorted(d.runtime_precision.items())),
    }


def diagnosis_text(d: Diagnosis, strict: bool = False, detail: str = "normal", source: str = "SRC") -> str:
    """The summary line first (counts and what to do), then the findings.

    `detail`: "normal" groups findings of one kind and message (grouping.py); "verbose" prints one line per
    finding; "quiet" prints the summary and the errors alone. `source`: SRC as the user named it, for the next command.
    """
    errors = [f for f in d.findings if f.severity is Severity.ERROR]
    warnings = [f for f in d.findings if f.severity is Severity.WARNING]
    lines = [f"target {d.target.spec} ({d.target.label}), tensor parallel {d.tp}: {len(errors)} error(s), {len(warnings)} warning(s)"
             + _next_step(d, strict, errors, warnings, source)]
    for o in d.first_errors:
        where = f"rank {o.rank} would stop" if d.tp > 1 else "the runtime would stop"
        lines.append(f"{where} at {o.tensor} with:\n    {o.error}")
    shown = errors if detail == "quiet" else errors + warnings
    lines += finding_lines(shown, d.tp, verbose=detail == "verbose")
    if detail == "quiet":
        return "\n".join(lines)
    lines += finding_lines(d.notes, d.tp, verbose=detail == "verbose", label="note")
    lines.append(f"bits per parameter: {d.bits_per_parameter:.3f}")
    if len(set(d.runtime_precision.values()) - {"bf16"}) > 1:
        lines.append(f"layers built as: {scheme_counts(d.runtime_precision)}")
    lines.append(checked(d))
    if d.scales and d.scales.line():  # block scales sampled, scanned or not read, and how to scan them
        lines.append(d.scales.line())
    if not errors and not (strict and warnings):
        lines.append(healthy(d) + (" (warnings ignored; --strict counts them)" if warnings else ""))
    return "\n".join(lines)


def healthy(d: Diagnosis) -> str:
    """The verdict without errors: "healthy" only where the target's loader was simulated (or it has none to simulate)."""
    return "healthy for this target" if d.simulated or not d.target.profile.allows_quant_config else "no problems found by these checks"


def _next_step(d: Diagnosis, strict: bool, errors: list, warnings: list, source: str) -> str:
    """What to do, on the summary line: a person reads the first line, and may read nothing else.
    The command runs as written (SRC quoted for the shell; OUT is the user's to choose)."""
    tp = f" --tp {d.tp}" if d.tp > 1 else ""
    command = f"ckpt-repair fix {shlex.quote(source)} -o OUT --target {shlex.quote(d.target.spec)}{tp} --dry-run"
    dry_run = f"`{one_line(command)}` shows the repair, or why there is none"
    if errors or (strict and warnings):
        return f"; next: {dry_run}"
    if warnings:
        return f"; no errors; for the warnings, {dry_run}"
    if uncovered(d):  # "nothing to do" would read as a verdict on a model whose layers no profile knows
        return (f"; nothing found, but {d.target.release.label}'s generated profile does not cover {d.architecture}: "
                "its layers were checked with generic roles only (see below)")
    return "; nothing to do"


def uncovered(d: Diagnosis) -> bool:
    """A target that reads the quantization config, whose release's generated profile has no row for the model."""
    release = d.target.release
    return (d.target.profile.allows_quant_config and not d.simulated and release is not None
            and (d.architecture not in release.entries or bool(d.family and d.family.not_covered)))


def checked(d: Diagnosis) -> str:
    """What doctor checked: the loader simulation only where it has a loader profile for the architecture."""
    if not d.target.profile.allows_quant_config:
        return f"checked: every tensor and config file against a plain {d.target.spec} checkpoint, format health"
    if d.target.profile.rules is not None:
        return (f"checked: {d.target.profile.speaker}'s own matching rules, fused-layer policy, draft rules and loaders "
                f"({d.target.profile.rules.source}) for {d.architecture}, format health, config consistency") + _rows(d)
    if d.simulated:
        return f"checked: {d.target.spec}'s loader simulated for {d.architecture}, format health, config consistency and exclusions"
    if d.target.release is not None and d.architecture in d.target.release.entries:  # a layer profile, not a loader's
        return f"checked: format health, config consistency and exclusions for {d.architecture} (no loader simulation for it)" + _rows(d)
    return f"no loader profile for {d.architecture}: checked format health, config consistency and exclusions only" + _rows(d)


def _rows(d: Diagnosis) -> str:
    """Whether the release's generated profile knew this architecture's layers (and if not, why it could not)."""
    release = d.target.release
    if release is None:
        return ""
    if d.family is not None and d.family.not_covered:
        return f"; {release.label}'s generated profile does not cover this config ({d.family.not_covered}), so generic layer roles were used"
    if d.family is not None and any(d.family.name == hand.name for hand in arch.ARCHITECTURES):
        return f"; its layer roles and fused layers are this project's hand row {d.family.name} (repair/arch/)"
    if d.architecture in release.entries:
        return f"; its layer roles and fused layers are {release.label}'s own (generated profile)"
    why = release.unprofiled.get(d.architecture, "not among its registered text-generation or multimodal "
                                 "generation architectures")
    return f"; {release.label}'s generated profile does not cover it ({why.splitlines()[0][:160]}), so generic layer roles were used"
