"""`ckpt-repair fix`: plan and write the repaired checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from repair.cli.main import cli, say


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Output folder (must not exist).")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new output is complete).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan / result as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def fix(src: Path, out: Path, dry_run: bool, overwrite: bool, as_json: bool, quiet: bool) -> None:
    """Repair SRC into OUT: dequantize wrongly packed layers and fix the exclusions."""
    from repair.execute import check_output, execute
    from repair.io.checkpoint import open_checkpoint
    from repair.plan import Recipe, make_plan
    from repair.plan_text import plan_as_json, plan_as_text

    plan = make_plan(open_checkpoint(src), Recipe())
    if plan.is_noop:
        say(as_json, {"status": "noop", "plan": plan_as_json(plan)}, f"{src}: nothing to repair; it is already fixed. Nothing written.")
        return
    check_output(src, out, overwrite)
    if dry_run:
        say(as_json, {"status": "dry-run", "plan": plan_as_json(plan)}, plan_as_text(plan) + "\n(dry run: nothing written)")
        return
    result = execute(plan, out, overwrite=overwrite, progress=False if quiet else None, options={"recipe": "default"})
    say(as_json, {"status": "written", "out": str(result.out), "plan": plan_as_json(plan)},
        plan_as_text(plan) + f"\nwrote {result.out} (report: {result.out / 'repair_report.json'})")
