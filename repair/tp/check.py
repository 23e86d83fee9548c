"""The check of a `fix --tp` layout, run before anything is read or written: like the plan check, a
failure is an InternalError (the layout is ours, whatever the input)."""

from __future__ import annotations

from repair.planning.check import failed
from repair.tp.manifest import RANK_FILE


def check_tp_plan(tpp) -> None:
    """The per-rank layout `fix --tp` will write: every rank file holds each output tensor once, each split
    tensor's rank ranges tile its dim exactly, and no rank's small file takes the rank file's name."""
    names = [t.step.out.name for t in tpp.tensors]
    planned = [t.out.name for s in tpp.plan.shards for t in s.tensors]
    if len(set(names)) != len(names) or sorted(names) != sorted(planned):
        raise failed(f"the --tp {tpp.tp} layout does not hold every output tensor exactly once")
    for t in tpp.tensors:
        ranges = t.spec.ranges(tpp.tp)
        if ranges and not _tile([r.stored for r in ranges], t.step.out.shape[t.spec.dim]):
            raise failed(f"--tp {tpp.tp}: the ranks' ranges of {t.step.out.name} do not tile its dim {t.spec.dim}")
    if RANK_FILE in tpp.plan.json_files or RANK_FILE in tpp.plan.copied_files:
        raise failed(f"--tp {tpp.tp}: a small file would take the rank file's name {RANK_FILE}")


def _tile(spans: list[tuple[int, int]], size: int) -> bool:
    """[start, end) spans laid end to end from 0 to `size`, none reversed (a rank may hold nothing)."""
    bounds = [0] + [b for span in spans for b in span] + [size]
    return all(a == b for a, b in zip(bounds[0::2], bounds[1::2])) and bounds == sorted(bounds)
