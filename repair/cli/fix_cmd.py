"""`ckpt-repair fix`: plan and write the repaired checkpoint."""

from __future__ import annotations

from pathlib import Path

import click

from repair.cli.main import cli, say


@cli.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Output folder (must not exist).")
@click.option("--target", "target_spec", default=None, help="Fix for vllm==X.Y.Z or bf16 (default: the handshake repair).")
@click.option("--dry-run", is_flag=True, help="Print the plan and write nothing.")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new output is complete).")
@click.option("--json", "as_json", is_flag=True, help="Print the plan / result as JSON.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def fix(src: Path, out: Path, target_spec: str | None, dry_run: bool, overwrite: bool, as_json: bool, quiet: bool) -> None:
    """Repair SRC into OUT: dequantize wrongly packed layers and fix the exclusions."""
    from repair.doctor import diagnose
    from repair.doctor_text import diagnosis_json
    from repair.execute import check_output, execute
    from repair.io.checkpoint import open_checkpoint
    from repair.plan import Recipe, make_plan
    from repair.plan_text import plan_as_json, plan_as_text
    from repair.target_recipe import recipe_for_target
    from repair.targets.profiles import resolve

    ckpt = open_checkpoint(src)
    target = resolve(target_spec)
    recipe = recipe_for_target(ckpt, target) if target_spec else Recipe()
    plan = make_plan(ckpt, recipe)
    if plan.is_noop:
        say(as_json, {"status": "noop", "plan": plan_as_json(plan)}, f"{src}: nothing to repair; it is already fixed. Nothing written.")
        return
    check_output(src, out, overwrite)
    if dry_run:
        say(as_json, {"status": "dry-run", "plan": plan_as_json(plan)}, plan_as_text(plan) + "\n(dry run: nothing written)")
        return

    def doctor_before_after(folder: Path) -> dict:
        before = diagnosis_json(diagnose(ckpt, target), strict=True)
        after = diagnosis_json(diagnose(open_checkpoint(folder), target), strict=True)
        return {"doctor": {"target": target.spec, "before": before, "after": after}}

    options = {"recipe": "target" if target_spec else "default", "target": target.spec if target_spec else None}
    result = execute(plan, out, overwrite=overwrite, progress=False if quiet else None, options=options, annotate=doctor_before_after)
    remaining = result.report["doctor"]["after"]["findings"]
    text = plan_as_text(plan) + f"\nwrote {result.out} (report: {result.out / 'repair_report.json'})"
    if remaining:
        text += f"\n{len(remaining)} finding(s) remain for {target.spec}; run `ckpt-repair doctor {result.out} --target {target.spec}`"
    say(as_json, {"status": "written", "out": str(result.out), "plan": plan_as_json(plan), "doctor_after": result.report["doctor"]["after"]}, text)
