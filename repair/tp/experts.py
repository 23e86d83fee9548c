"""`fix --tp` of ModelOpt's 3-D experts: each expert is dequantized in turn and each rank's part of it written at its
offset in that rank's file (the header fixes every offset), so memory holds one expert, never the tensor and its N
slices (a gpt-oss-120b gate_up_proj is 4 GiB in BF16, 33 MiB an expert). The bytes are the whole tensor's, sliced."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from repair.execute.compute import Computer
from repair.io.shard_writer import ShardWriter
from repair.targets.tp_rules import RankRange

PLACED = "placed"  # a tensor's rank parts are in the rank files already: the writer hashes them in turn


def place_experts(computer: Computer, name: str, step, dim: int | None, ranges: Sequence[RankRange | None],
                  writers: Sequence[ShardWriter]) -> str:
    """Write every rank's part of 3-D experts `step`, expert by expert (any thread); `ranges`: each rank's range of
    `dim`, None where the rank holds the whole tensor."""
    for e, bits in enumerate(computer.each_expert(step)):
        for writer, rng in zip(writers, ranges):
            part, index = _rank_part(bits, e, dim, rng)
            if part is not None:
                writer.place_part(name, index * part.nbytes, part)
    return PLACED


def _rank_part(bits: np.ndarray, e: int, dim: int | None, rng: RankRange | None) -> tuple[np.ndarray | None, int]:
    """Expert e's part on one rank [in, out] (or its rows or columns), and its index among the rank's experts; None:
    the rank holds another range of experts."""
    if rng is None:
        return bits, e
    lo, hi = rng.stored
    if dim == 0:
        return (bits, e - lo) if lo <= e < hi else (None, 0)
    return np.ascontiguousarray(bits[lo:hi] if dim == 1 else bits[:, lo:hi]), e
