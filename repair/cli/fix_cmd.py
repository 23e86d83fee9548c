"""`ckpt-repair fix`: build a recipe from the flags, plan, and write the repaired checkpoint."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from repair.cli.fix_options import FixOptions, shared
from repair.cli.main import say


@click.command()
@click.argument("src", type=click.Path(path_type=Path))
@click.option("-o", "--out", type=click.Path(path_type=Path), required=True, help="Output folder (must not exist).")
@shared("target_spec")
@shared("recipe_path")
@shared("original")
@shared("requantize")
@shared("force")
@shared("dry_run")
@click.option("--overwrite", is_flag=True, help="Replace OUT if it exists (only once the new output is complete).")
@shared("as_json")
@shared("quiet")
@shared("verbose")
@shared("jobs")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="Write one checkpoint per tensor-parallel rank (OUT/rank-R/) and tp_manifest.json.")
def fix(src: Path, out: Path, overwrite: bool, tp: int | None, **values) -> None:
    """Repair SRC into OUT: dequantize wrongly packed layers and fix the exclusions."""
    from repair import api
    from repair.io.atomic import check_output
    from repair.planning.target_check import load_doubts
    from repair.planning.text import plan_as_json, plan_as_text

    o = FixOptions.take(values)
    as_json, dry_run, force, progress = o.as_json, o.dry_run, o.force, None if not o.quiet else False
    recipe, original = o.recipe(), Path(o.original) if o.original else None
    from repair.cli.sources import open_source  # SRC / --original: local folders or Hub repo ids
    from repair.hub.source import labeled, localize_plan

    local = tuple(Path(p) for p in (src, original) if p is not None and Path(p).exists())  # never removed by a cleanup
    ckpt, orig = open_source(src, inputs=local), open_source(original, inputs=local) if original else None
    with labeled(ckpt, orig):
        plan = api.plan(ckpt, recipe, original=orig)
    if tp is not None:  # per-rank output, written even when the plan changes nothing
        from repair.tp.write import fix_tp

        plan = plan if dry_run else localize_plan(plan)
        written, text = fix_tp(plan, out, tp, dry_run=dry_run, overwrite=overwrite, progress=progress, force=force, jobs=o.jobs, detail=o.detail)
        say(as_json, written, "\n".join([text, *load_doubts(plan.before)]))
        return
    if plan.is_noop:
        say(as_json, {"status": "noop", "plan": plan_as_json(plan)}, "\n".join([_noop_text(src, plan), *load_doubts(plan.before)]))
        return
    check_output(src, out, overwrite, original)
    if dry_run:
        say(as_json, {"status": "dry-run", "plan": plan_as_json(plan)}, "\n".join([plan_as_text(plan, o.verbose), *load_doubts(plan.before), "(dry run: nothing written)"]))
        return
    plan = localize_plan(plan)  # a Hub SRC / --original is downloaded (huggingface_hub's cache) to write a local OUT
    result = api.run(plan, out, overwrite=overwrite, progress=progress, force=force, jobs=o.jobs)
    say(as_json, {"status": "written", "out": str(result.out), "plan": plan_as_json(plan), "report": result.report}, _summary(plan, result, o))


def _noop_text(src: Path, plan) -> str:
    target = plan.recipe.from_target
    if target:
        return f"{src}: nothing to fix for {target}: doctor's checks for it find nothing a repair would change. Nothing written."
    return f"{src}: nothing to repair; it is already fixed. Nothing written."


def _summary(plan, result, o: FixOptions) -> str:
    """What was written, what is left and the --original check first; then, unless --quiet, the plan."""
    from repair.planning.model import ChangeAction
    from repair.planning.target_check import load_doubts
    from repair.planning.text import plan_as_text, plan_warnings

    lines = [f"wrote {result.out} (report: {result.out / 'repair_report.json'})"]
    doctor = result.report["doctor"]
    for record in doctor.get("targets", [doctor]):  # several targets: one record each
        if record["after"]["findings"]:
            lines.append(f"{len(record['after']['findings'])} finding(s) remain for {record['target']}; run `ckpt-repair doctor {shlex.quote(str(result.out))} --target {shlex.quote(record['target'])}`")
    lines += load_doubts(plan.before)
    original = result.report.get("original")
    if original:
        lines.append(f"original verified: {original['verified']} of {original['checked']} modules reproduce byte-for-byte"
                     + (" (--force: used anyway)" if original["forced"] and not original["verified"] else ""))
        taken = {c.module for c in plan.changes if c.action in (ChangeAction.TAKE_ORIGINAL, ChangeAction.REQUANTIZE)}
        for module in original["corrupted"]:
            fate = "taken from the original" if module in taken else "kept as stored; add it to a take_original rule to take it from the original"
            lines.append(f"  {module}: its NVFP4 copy is {original['relative_error'][module]:.0%} off the original (corrupted); {fate}")
    return "\n".join(lines + (plan_warnings(plan) if o.quiet else [plan_as_text(plan, o.verbose)]))
