"""`fix --target T` promises an output that `doctor --strict` passes for T; refuse, before writing, what it cannot.

A broken or missing scale (NaN / infinite / zero weight scale, bad block scales, a missing input_scale, a broken
KV-cache scale) of a layer the output keeps as stored computes garbage in T, and no target's repair clears it:
that needs the original model (--original with a take_original or requantize rule) or a fresh export. Modules
the plan changes are exempt (a dequantize checks their scales itself), and so are KV-cache scales the plan drops.
"""

from __future__ import annotations

from repair.doctor.diagnose import diagnose
from repair.doctor.findings import Finding, Kind, Severity
from repair.errors import BadInput
from repair.formats.base import Declaration
from repair.io.checkpoint import Checkpoint
from repair.planning.recipe import Action, Recipe
from repair.targets.profiles import resolve

STORED_DEFECTS = frozenset({Kind.GLOBAL_SCALE, Kind.FP8_SCALE, Kind.BLOCK_SCALES, Kind.SCALE_OVERFLOW, Kind.MISSING_WEIGHT_SCALE,
                            Kind.MISSING_SCALE_2, Kind.SCALE_SHAPE, Kind.INPUT_SCALE, Kind.MISSING_INPUT_SCALE, Kind.KV_CACHE_SCALES})


def refuse_stored_defects(ckpt: Checkpoint, recipe: Recipe, declaration: Declaration, actions: dict[str, Action]) -> None:
    """One line naming the first stored defect `recipe` (derived from a target) leaves in a kept layer."""
    if not recipe.from_target:
        return
    changed = tuple(n + "." for n, a in actions.items() if a != Action.KEEP)
    kv_dropped = recipe.drop_quantization or declaration.kv_cache is None
    left = [f for f in diagnose(ckpt, resolve(recipe.from_target)).findings
            if f.code in STORED_DEFECTS and f.severity in (Severity.ERROR, Severity.WARNING)
            and not (f.subject + ".").startswith(changed) and not (f.code == Kind.KV_CACHE_SCALES and kv_dropped)]
    if left:
        raise cannot_repair(ckpt.root, recipe.from_target, left)


def cannot_repair(root: object, target: str, left: list[Finding]) -> BadInput:
    """The one line for stored defects a --target repair leaves (planning, and the writer's check of its output)."""
    return BadInput(f"{root}: --target {target} cannot repair {len(left)} finding(s) doctor --strict reports for it "
                    f"([{left[0].code}] {left[0].message.split('; ')[0]}, ...), so its output would not pass; nothing was written; "
                    "re-download or re-export the checkpoint, or repair those modules with a recipe (--original to take or requantize them)")
