"""NVFP4 sanity checks that read only scale bytes (a few KB to MB), never torch.

Broken scales are how NVFP4 checkpoints go silently wrong: a NaN or non-positive global
scale, NaN / negative / zero block scales, or fused siblings (gate/up, q/k/v) whose global
scales differ, which vLLM resolves by taking the max without rescaling the block scales.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from repair.io.safetensors import TensorInfo, read_bytes

# float8_e4m3fn: 0x7F / 0xFF are NaN, 0x00 / 0x80 are +-0, a set bit 7 is negative.
Reader = Callable[[Path, TensorInfo], bytearray]  # read_bytes, or a RangeReader
_CATEGORY = bytes(3 if b & 0x7F == 0x7F else 0 if b & 0x7F == 0 else 2 if b & 0x80 else 1 for b in range(256))


@dataclass(frozen=True)
class BlockScaleStats:
    nan: int
    negative: int
    zero: int


def read_f32_scalar(path: Path, info: TensorInfo, read: Reader = read_bytes) -> float:
    """The value of a stored float32 scalar ([] or [1])."""
    return struct.unpack("<f", bytes(read(path, info)[:4]))[0]


def block_scale_stats(path: Path, info: TensorInfo, read: Reader = read_bytes) -> BlockScaleStats:
    """Count NaN, negative and zero fp8 block scales (ModelOpt writes 1.0 for all-zero blocks, never 0)."""
    data = bytes(read(path, info)).translate(_CATEGORY)
    return BlockScaleStats(nan=data.count(3), negative=data.count(2), zero=data.count(0))


def global_scale_problem(value: float) -> str | None:
    """Why a weight_scale_2 value is unusable, or None when it is a positive finite number."""
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite"
    if value <= 0:
        return f"is {value} (must be > 0)"
    return None
