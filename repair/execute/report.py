"""repair_report.json: what was read, what changed and what was written, enough to audit a repair."""

from __future__ import annotations

from repair import __version__
from repair.io.names import path_text
from repair.io.output import REPORT_NAME  # noqa: F401  (the name every output holds; defined where --overwrite checks it)
from repair.planning.model import Plan


def build_report(plan: Plan, hashes: dict[str, dict[str, str]], options: dict) -> dict:
    """The report as a JSON-ready dict; deterministic for the same input and options."""
    return {
        "tool": {"name": "ckpt-repair", "version": __version__},
        "options": options,
        "recipe": plan.recipe.as_dict(),
        "original": None if plan.original is None else {"path": path_text(plan.original.root)},
        "source": {
            "path": path_text(plan.source.root),
            "files": [{"name": n, "sha256": h["source"]} for n, h in sorted(hashes.items()) if h["source"]],
        },
        "changes": [
            {
                "module": c.module,
                "action": c.action,
                "before": [t.as_dict() for t in c.before],
                "after": [t.as_dict() for t in c.after],
            }
            for c in plan.changes
        ],
        "exclusions_added": list(plan.exclusions_added),
        "removed": list(plan.removed_files),  # source files with no counterpart in the output (emptied shards, a dropped config)
        "outputs": [{"name": n, "sha256": h["output"]} for n, h in sorted(hashes.items())],
    }


def doctor_section(target, before, after) -> dict:
    """The report's "doctor" entry: the target, and doctor's strict JSON on the input and on the output."""
    from repair.doctor.text import diagnosis_json

    return {"target": target.spec, "before": diagnosis_json(before, strict=True), "after": diagnosis_json(after, strict=True)}


def original_section(plan: Plan, force: bool) -> dict:
    """The report's "original" entry: the --original model's path and how it was verified (refused unless force)."""
    from repair.execute.verify_original import assess_original

    return {"path": path_text(plan.original.root), **assess_original(plan, force).as_dict()}
