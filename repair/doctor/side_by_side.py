"""Several targets' diagnoses of one checkpoint, side by side (`doctor --target a,b,c`).

Text: the summary line first (how many targets load it, what to do), one line per target with its verdict,
then the findings every target shares, said once, and the rest under the target they belong to. JSON: the
worst exit code and each target's one-target object, unchanged, so a program reads either form the same way.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from repair.doctor.findings import Diagnosis, Finding, Severity
from repair.doctor.grouping import finding_lines
from repair.doctor.text import checked, diagnosis_json, diagnosis_text, healthy, uncovered
from repair.errors import one_line


def worst_exit_code(diagnoses: tuple[Diagnosis, ...], strict: bool = False) -> int:
    return max(d.exit_code(strict) for d in diagnoses)


def several_json(diagnoses: tuple[Diagnosis, ...], strict: bool = False) -> dict:
    return {"exit_code": worst_exit_code(diagnoses, strict), "targets": [diagnosis_json(d, strict) for d in diagnoses]}


def verdicts_json(diagnoses: tuple[Diagnosis, ...], strict: bool = False) -> dict:
    """One target: its own object, as doctor printed it before there were several; else several_json."""
    return diagnosis_json(diagnoses[0], strict) if len(diagnoses) == 1 else several_json(diagnoses, strict)


def verdicts_text(diagnoses: tuple[Diagnosis, ...], strict: bool = False, detail: str = "normal", source: str = "SRC") -> str:
    """One target: its own text, unchanged; else several_text."""
    if len(diagnoses) == 1:
        return diagnosis_text(diagnoses[0], strict, detail, source)
    return several_text(diagnoses, strict, detail, source)


def several_text(diagnoses: tuple[Diagnosis, ...], strict: bool = False, detail: str = "normal", source: str = "SRC") -> str:
    """Summary line, a verdict line per target, shared findings once, then each target's own (with where it stops)."""
    bad = [d for d in diagnoses if d.exit_code(strict)]
    specs = ",".join(d.target.spec for d in diagnoses)
    tp = diagnoses[0].tp
    lines = [f"{len(diagnoses)} targets, tensor parallel {tp}: {len(diagnoses) - len(bad)} clean, {len(bad)} with problems" + (
        f"; next: `{one_line(_fix_command(source, specs, tp))}` shows one repair for all of them, or why there is none"
        if bad else _nothing(diagnoses))]
    width = max(len(d.target.spec) for d in diagnoses)
    lines += [f"  {d.target.spec:<{width}}  {_verdict(d, strict)}" for d in diagnoses]
    shown = [{_neutral(f, d.target.spec): f for f in _shown(d, detail)} for d in diagnoses]
    shared = [f for f in shown[0] if all(f in s for s in shown[1:])]
    shared_keys = set(shared)  # thousands of findings (10^4 hostile entries): a set, not findings x findings
    verbose = detail == "verbose"
    if shared:
        lines += ["every target:"] + _indented(finding_lines(shared, tp, verbose))
    for d, own in zip(diagnoses, shown):
        mine = [f for key, f in own.items() if key not in shared_keys]
        stops = [f"{f'rank {o.rank} would stop' if tp > 1 else 'the runtime would stop'} at {o.tensor} with: {o.error}" for o in d.first_errors]
        notes = [] if detail == "quiet" else finding_lines(d.notes, tp, verbose, label="note")
        extra = [] if detail == "quiet" else [checked(d)]
        if stops or mine or notes or extra:
            lines += [f"{d.target.spec} ({d.target.label}):"] + _indented([one_line(s) for s in stops] + finding_lines(mine, tp, verbose)
                                                                          + notes + extra)
    if detail != "quiet":
        lines.append(f"bits per parameter: {diagnoses[0].bits_per_parameter:.3f}")
        if diagnoses[0].scales and diagnoses[0].scales.line():
            lines.append(diagnoses[0].scales.line())
    return "\n".join(map(one_line, lines))  # a target's spelling may hold control characters: each line stays one line


def _verdict(d: Diagnosis, strict: bool) -> str:
    errors = sum(f.severity is Severity.ERROR for f in d.findings)
    warnings = sum(f.severity is Severity.WARNING for f in d.findings)
    counts = f"{errors} error(s), {warnings} warning(s)"
    if d.first_errors:
        return f"{counts}: does not load (stops at {d.first_errors[0].tensor})"
    if errors:
        return f"{counts}: not clean"
    if strict and warnings:
        return f"{counts}: loads; the warnings count (--strict)"
    return f"{counts}: {healthy(d)}" + (" (warnings ignored; --strict counts them)" if warnings else "")


def _shown(d: Diagnosis, detail: str) -> list[Finding]:
    errors = [f for f in d.findings if f.severity is Severity.ERROR]
    return errors if detail == "quiet" else errors + [f for f in d.findings if f.severity is Severity.WARNING]


def _neutral(f: Finding, spec: str) -> Finding:
    """The finding with its target's name put as "each target": equal for two targets means said once for all."""
    return replace(f, message=f.message.replace(spec, "each target"),
                   runtime_error=None if f.runtime_error is None else f.runtime_error.replace(spec, "each target"))


def _fix_command(source: str, specs: str, tp: int) -> str:
    return f"ckpt-repair fix {shlex.quote(source)} -o OUT --target {shlex.quote(specs)}{f' --tp {tp}' if tp > 1 else ''} --dry-run"


def _indented(lines: list[str]) -> list[str]:
    return ["  " + line for line in lines]


def _nothing(diagnoses: tuple[Diagnosis, ...]) -> str:
    """All clean: "nothing to do", unless a target's generated profile has no row for the model (doctor/text.py)."""
    blind = [d.target.spec for d in diagnoses if uncovered(d)]
    if not blind:
        return "; nothing to do"
    return (f"; nothing found, but the generated profiles {', '.join(blind)} use do not cover {diagnoses[0].architecture}: "
            "its layers were checked with generic roles only (see below)")

