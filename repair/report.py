"""repair_report.json: what was read, what changed and what was written, enough to audit a repair."""

from __future__ import annotations

from repair import __version__
from repair.planning import Plan

REPORT_NAME = "repair_report.json"


def build_report(plan: Plan, hashes: dict[str, dict[str, str]], options: dict) -> dict:
    """The report as a JSON-ready dict; deterministic for the same input and options."""
    return {
        "tool": {"name": "ckpt-repair", "version": __version__},
        "options": options,
        "recipe": plan.recipe.as_dict(),
        "original": None if plan.original is None else {"path": str(plan.original.root)},
        "source": {
            "path": str(plan.source.root),
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
        "outputs": [{"name": n, "sha256": h["output"]} for n, h in sorted(hashes.items())],
    }
