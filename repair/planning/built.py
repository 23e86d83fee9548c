"""Which class each of a fix's targets builds, as planning asks it: the row whose fused layers, prefixes and expected
modules the plan obeys. Doctor decided it for the input (each Diagnosis carries its target's row, from that release's
own registry: targets/profiles.Target.built); planning never asks the newest release's choice for another target."""

from __future__ import annotations

from repair import arch
from repair.arch.base import Architecture
from repair.doctor.findings import Diagnosis
from repair.io.checkpoint import Checkpoint
from repair.targets.layer_names import target_family
from repair.targets.profiles import Target, resolve_many


def built_family(ckpt: Checkpoint, diagnosis: Diagnosis) -> Architecture:
    """The row of the class the diagnosis's target builds: doctor's, else decided here (a Diagnosis made by hand)."""
    return diagnosis.family if diagnosis.family is not None else target_family(diagnosis.target, ckpt.config)


def built_families(ckpt: Checkpoint, before: tuple[Diagnosis, ...]) -> list[Architecture]:
    """One row per diagnosed target; none diagnosed: the default target's (the newest vLLM release's)."""
    return [built_family(ckpt, d) for d in before] or [arch.architecture(ckpt.config)]


def target_rows(ckpt: Checkpoint, spec: str | None, before: tuple[Diagnosis, ...]) -> tuple[tuple[Target, ...], list[Architecture]]:
    """(the targets `spec` names, the row each builds, in their order): doctor's decision where `before` holds that
    target's verdict, else its own release's resolution; no target: (), the default target's row."""
    targets = resolve_many(spec) if spec else ()
    decided = {d.target.spec: built_family(ckpt, d) for d in before}
    families = [decided.get(t.spec) or target_family(t, ckpt.config) for t in targets]
    return targets, families or [arch.architecture(ckpt.config)]
