"""A diagnosis as text for people and JSON for programs."""

from __future__ import annotations

from repair.doctor.findings import Diagnosis, Severity
from repair.doctor.schemes import scheme_counts


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
        "runtime_stops_at": [{"rank": o.rank, "tensor": o.tensor, "error": o.error} for o in d.first_errors],
        "findings": [
            {"severity": f.severity, "code": f.code, "subject": f.subject, "message": f.message,
             "runtime_error": f.runtime_error, "ranks": list(f.ranks)}
            for f in d.findings
        ],
        "notes": [{"code": f.code, "subject": f.subject, "message": f.message} for f in d.notes],
        "schemes": dict(sorted(d.runtime_precision.items())),
    }


def diagnosis_text(d: Diagnosis, strict: bool = False) -> str:
    errors = [f for f in d.findings if f.severity is Severity.ERROR]
    warnings = [f for f in d.findings if f.severity is Severity.WARNING]
    lines = [f"target {d.target.spec} ({d.target.label}), tensor parallel {d.tp}: {len(errors)} error(s), {len(warnings)} warning(s)"]
    for o in d.first_errors:
        where = f"rank {o.rank} would stop" if d.tp > 1 else "the runtime would stop"
        lines.append(f"{where} at {o.tensor} with:\n    {o.error}")
    for f in errors + warnings:
        lines.append(f"{f.severity}: [{f.code}] {f.message}")
        if f.runtime_error:
            ranks = f" (rank {', '.join(map(str, f.ranks))})" if d.tp > 1 else ""
            lines.append(f"    runtime error{ranks}: {f.runtime_error}")
    lines += [f"note: [{f.code}] {f.message}" for f in d.notes]
    lines.append(f"bits per parameter: {d.bits_per_parameter:.3f}")
    if len(set(d.runtime_precision.values()) - {"bf16"}) > 1:
        lines.append(f"layers built as: {scheme_counts(d.runtime_precision)}")
    lines.append(checked(d))
    if not errors and not (strict and warnings):
        verdict = "healthy for this target" if d.simulated or d.target.profile.runtime != "vllm" else "no problems found by these checks"
        lines.append(verdict + (" (warnings ignored; --strict counts them)" if warnings else ""))
    return "\n".join(lines)


def checked(d: Diagnosis) -> str:
    """What doctor checked: the loader simulation only where it has a loader profile for the architecture."""
    if d.target.profile.runtime != "vllm":
        return f"checked: every tensor and config file against a plain {d.target.spec} checkpoint, format health"
    if d.simulated:
        return f"checked: {d.target.spec}'s loader simulated for {d.architecture}, format health, config consistency and exclusions"
    return f"no loader profile for {d.architecture}: checked format health, config consistency and exclusions only" + _rows(d)


def _rows(d: Diagnosis) -> str:
    """Whether the release's generated profile knew this architecture's layers (and if not, why it could not)."""
    release = d.target.release
    if release is None:
        return ""
    if d.architecture in release.entries:
        return f"; its layer roles and fused layers are {release.label}'s own (generated profile)"
    why = release.unprofiled.get(d.architecture, "not among its registered text-generation architectures")
    return f"; {release.label}'s generated profile does not cover it ({why.splitlines()[0][:160]}), so generic layer roles were used"
