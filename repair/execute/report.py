"""repair_report.json: what was read, what changed and what was written, enough to audit a repair.

The one place the report is assembled, for every command that writes one: `fix` (here and through
the Python API), `fix --tp`, `unshard` and `hub fix`. What differs between them comes in as typed
sections (doctor, the original's verification, the TP split), never as dicts patched in afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from repair.version import __version__
from repair.doctor.diagnose import Diagnosis, diagnose
from repair.doctor.text import diagnosis_json
from repair.io.names import path_text
from repair.io.output import REPORT_NAME  # noqa: F401  (the name every output holds; defined where --overwrite checks it)
from repair.planning.model import Plan
from repair.targets.profiles import Target, resolve_many

if TYPE_CHECKING:  # verify_original imports torch: only the function that verifies imports it
    from repair.execute.verify_original import OriginalAssessment

Hashes = dict[str, dict[str, str | None]]  # file -> {"source": sha256 or None, "output": sha256}


@dataclass(frozen=True)
class DoctorRecord:
    """doctor's strict verdict for the target on the input and, where the command wrote a standard
    checkpoint, on the output (per-rank output has none: `unshard` it to doctor the result)."""

    target: Target
    before: Diagnosis
    after: Diagnosis | None = None
    tp: int | None = None

    def as_dict(self) -> dict:
        out: dict = {"target": self.target.spec}
        if self.tp is not None:
            out["tp"] = self.tp
        out["before"] = _verdict(self.before)
        if self.after is not None:
            out["after"] = _verdict(self.after)
        return out


def _verdict(d: Diagnosis) -> dict:
    """doctor's strict verdict as the report records it: what it found, not how it read the bytes (`scale_checks`
    differs between a folder and the same files on the Hub, where no block-scale sample is read)."""
    return {k: v for k, v in diagnosis_json(d, strict=True).items() if k != "scale_checks"}


@dataclass(frozen=True)
class TpRecord:
    """How `fix --tp` split the output."""

    degree: int
    parallel_plan: str  # where the split styles came from
    manifest: str  # the manifest's file name in OUT

    def as_dict(self) -> dict:
        return {"degree": self.degree, "parallel_plan": self.parallel_plan, "manifest": self.manifest}


@dataclass(frozen=True)
class Sections:
    """The command-specific parts of a report."""

    doctor: tuple[DoctorRecord, ...] = ()  # one per --target
    original: OriginalAssessment | None = None  # how --original was verified
    tp: TpRecord | None = None
    source_files: tuple[tuple[str, str], ...] | None = None  # (name, sha256) when the outputs do not map 1:1 to sources

    @property
    def targets(self) -> tuple[Target, ...]:
        return tuple(r.target for r in self.doctor)

    def with_after(self, after: tuple[Diagnosis, ...]) -> "Sections":
        """doctor on the output, one Diagnosis per target in the order of `doctor`."""
        return replace(self, doctor=tuple(replace(r, after=a) for r, a in zip(self.doctor, after, strict=True)))

    def doctor_dict(self) -> dict:
        """The report's "doctor": one target's record as it always was; several: {"targets": [each record]}."""
        records = [r.as_dict() for r in self.doctor]
        return records[0] if len(records) == 1 else {"targets": records}


def recipe_options(plan: Plan) -> dict:
    """The report's "options": the recipe's name and the target it was derived from (None: no --target)."""
    return {"recipe": plan.recipe.name, "target": plan.recipe.from_target}


def input_sections(plan: Plan, force: bool, tp: int | None = None, jobs: int = 1) -> Sections:
    """What a command records about its input before writing: the --original verification (refused
    unless `force`; `jobs` modules at once) and doctor on the input for each of the recipe's targets (else the newest
    known): the plan's own verdicts where they are at this degree, else asked here."""
    planned = {d.target.spec: d for d in plan.before} if (tp or 1) == 1 else {}
    records = tuple(DoctorRecord(t, planned.get(t.spec) or diagnose(plan.source, t, tp or 1), tp=tp) for t in resolve_many(plan.recipe.from_target))
    return Sections(doctor=records, original=_assessed(plan, force, jobs))


def _assessed(plan: Plan, force: bool, jobs: int) -> OriginalAssessment | None:
    if plan.original is None:
        return None
    from repair.execute.verify_original import assess_original  # imports torch

    return assess_original(plan, force, jobs)


def build_report(plan: Plan, hashes: Hashes, options: dict, sections: Sections = Sections()) -> dict:
    """The report as a JSON-ready dict; deterministic for the same input and options."""
    report = {
        "tool": _tool(),
        "options": options,
        "recipe": plan.recipe.as_dict(),
        "original": _original(plan, sections),
        "source": {"path": path_text(plan.source.root), "files": _source_files(hashes, sections)},
        "changes": [c.as_dict() for c in plan.changes],
        "exclusions_added": list(plan.exclusions_added),
        "exclusions_removed": list(plan.exclusions_removed),
        "removed": list(plan.removed_files),  # source files with no counterpart in the output (emptied shards, a dropped config)
        "outputs": [{"name": n, "sha256": h["output"]} for n, h in sorted(hashes.items())],
    }
    if sections.tp is not None:
        report["tp"] = sections.tp.as_dict()
    if sections.doctor:
        report["doctor"] = sections.doctor_dict()
    return report


def unshard_report(src, manifest_sha256: str, tp: int, fixed_from: str, outputs: dict[str, str]) -> dict:
    """`unshard`'s report: the per-rank folder it read and the standard files it rebuilt ({name: sha256})."""
    return {
        "tool": _tool(), "operation": "unshard",
        "source": {"path": path_text(src), "manifest_sha256": manifest_sha256, "tp": tp, "fixed_from": fixed_from},
        "outputs": [{"name": n, "sha256": h} for n, h in sorted(outputs.items())],
    }


def _tool() -> dict:
    return {"name": "ckpt-repair", "version": __version__}


def _original(plan: Plan, sections: Sections) -> dict | None:
    if plan.original is None:
        return None
    verified = sections.original.as_dict() if sections.original is not None else {}
    return {"path": path_text(plan.original.root), **verified}


def _source_files(hashes: Hashes, sections: Sections) -> list[dict]:
    if sections.source_files is not None:
        return [{"name": n, "sha256": h} for n, h in sections.source_files]
    return [{"name": n, "sha256": h["source"]} for n, h in sorted(hashes.items()) if h["source"]]
