"""ModelOpt's 3-D experts written expert by expert: each expert is dequantized in turn and written at its offset in the
output file (`fix`), or each rank's part of it in that rank's file (`fix --tp`); the header fixes every offset. So
memory holds one expert, never the tensor (a gpt-oss-120b gate_up_proj is 4 GiB in BF16, 33 MiB an expert) nor its N
rank slices. The bytes are the whole tensor's (sliced per rank)."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repair.execute.compute import Computer
from repair.io.shard_writer import ShardWriter
from repair.targets.tp_rules import RankRange

PLACED = "placed"  # a tensor's bytes are in the output file(s) already: the writer hashes them in turn


def place_experts(computer: Computer, name: str, step, dim: int | None, ranges: Sequence[RankRange | None],
                  writers: Sequence[ShardWriter]) -> str:
    """Write each writer's part of 3-D experts `step`, expert by expert (any thread); `ranges`: each writer's range of
    `dim`, None where it holds the whole tensor (`fix`: one writer, None)."""
    for e, bits in enumerate(computer.each_expert(step)):
        for writer, rng in zip(writers, ranges):
            part, index = _rank_part(bits, e, dim, rng)
            if part is not None:
                writer.place_part(name, index * part.nbytes, part)
    return PLACED


def _rank_part(bits: np.ndarray, e: int, dim: int | None, rng: RankRange | None) -> tuple[np.ndarray | None, int]:
    """Expert e's part on one writer [in, out] (or its rows or columns), and its index among the writer's experts;
    None: the writer holds another range of experts."""
    if rng is None:
        return bits, e
    lo, hi = rng.stored
    if dim == 0:
        return (bits, e - lo) if lo <= e < hi else (None, 0)
    return np.ascontiguousarray(bits[lo:hi] if dim == 1 else bits[:, lo:hi]), e
