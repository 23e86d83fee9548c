"""The Python API: `plan(src, recipe)` to see what would be done, `run(plan, out)` to do it.

Both return values (a Plan; a Result with the report) and print nothing, so scripts, notebooks
and the CLI share one path.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from repair import formats
from repair.doctor.diagnose import Diagnosis, diagnose_each
from repair.execute.report import input_sections, recipe_options
from repair.execute.parallel import default_jobs
from repair.execute.writer import Result, execute
from repair.io.checkpoint import Checkpoint, open_checkpoint
from repair.planning.build import make_plan
from repair.planning.from_target import recipe_for_targets
from repair.planning.model import Plan
from repair.planning.recipe import DEFAULT, Recipe, load_recipe
from repair.targets.profiles import resolve_many

WEIGHTS = ("weight", "weight_packed")  # a changed module's tensors a plan-time check does not read (its scales it does)


def plan(src: str | Path | Checkpoint, recipe: Recipe | str | Path = DEFAULT, *, original: str | Path | Checkpoint | None = None,
         before: tuple[Diagnosis, ...] | None = None) -> Plan:
    """Plan a repair from headers (and, for a Hub repo, the scales of the modules it changes, which its checks read).
    `recipe` is a Recipe, a recipe file, a built-in name or a report. `before`: doctor's verdicts on `src` for each of
    `recipe.target`'s targets at tp 1, where the caller has them (the page does), so they are not asked again."""
    ckpt = src if isinstance(src, Checkpoint) else open_checkpoint(Path(src))
    orig = None if original is None else original if isinstance(original, Checkpoint) else open_checkpoint(Path(original))
    recipe = recipe if isinstance(recipe, Recipe) else load_recipe(Path(recipe))
    if before is None:
        before = diagnose_each(ckpt, resolve_many(recipe.target)) if recipe.target else ()  # asked once per target, passed along
    resolved = resolve_recipe(ckpt, recipe, before)
    if orig is not None:
        resolved = resolved.using_original()
    made = make_plan(ckpt, resolved, orig, before)
    infos = ckpt.infos()
    scales = [infos[t.name] for c in made.changes for t in c.before if t.name in infos and t.name.rpartition(".")[2] not in WEIGHTS]
    if ckpt.byte_source is not None and ckpt.byte_source.store(scales):
        made = make_plan(ckpt, resolved, orig, before)  # a Hub repo: the plan-time checks again, on the changed modules' scale bytes
    return made


def resolve_recipe(ckpt: Checkpoint, recipe: Recipe, before: tuple[Diagnosis, ...] | None = None) -> Recipe:
    """Fold `recipe.target` (one or several) into explicit module actions, so the recipe in the report reproduces
    exactly. `before`: doctor's verdict on `ckpt` for each target, where the caller has it."""
    if not recipe.target:
        return recipe
    matcher = recipe.matcher(recipe.drop) if recipe.drop else None
    dropped = frozenset(m.name for m in formats.detect(ckpt).group_modules(ckpt.infos()) if matcher and matcher.matches(m.name))
    derived = recipe_for_targets(ckpt, before or diagnose_each(ckpt, resolve_many(recipe.target)), dropped)
    extra = tuple(n for n in derived.dequantize if n not in recipe.dequantize)
    return replace(recipe, dequantize=recipe.dequantize + extra, target=None, from_target=derived.from_target,
                   drop_quantization=recipe.drop_quantization or derived.drop_quantization)


def run(plan: Plan, out: str | Path, *, overwrite: bool = False, progress: bool = False, force: bool = False,
        jobs: int | None = None) -> Result:
    """Write the planned checkpoint to `out` (atomically) and return the report.

    With an original model, it is first verified against the checkpoint (refused unless `force`).
    The report records doctor before and after for the recipe's target (else the newest known).
    `jobs` tensors are computed at once (default: one per core); the output is the same for every value.
    """
    jobs = jobs or default_jobs()
    sections = input_sections(plan, force, jobs=jobs)
    return execute(plan, Path(out), overwrite=overwrite, progress=progress, options=recipe_options(plan), sections=sections,
                   after=lambda folder: diagnose_each(open_checkpoint(folder), sections.targets), jobs=jobs)
