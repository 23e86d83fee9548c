"""NVFP4 sanity checks that read only scale bytes (a few KB to MB), never torch.

Broken scales are how NVFP4 checkpoints go silently wrong: a NaN or non-positive global
scale, NaN / negative / zero block scales, or fused siblings (gate/up, q/k/v) whose global
scales differ, which vLLM resolves by taking the max without rescaling the block scales.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from repair.io.ranges import read_bytes
from repair.io.safetensors import TensorInfo

# float8_e4m3fn: 0x7F / 0xFF are NaN, 0x00 / 0x80 are +-0, a set bit 7 is negative.
Reader = Callable[[Path, TensorInfo], bytearray]  # read_bytes, or a RangeReader
_CATEGORY = bytes(3 if b & 0x7F == 0x7F else 0 if b & 0x7F == 0 else 2 if b & 0x80 else 1 for b in range(256))


DTYPE_MAX = {"BF16": 3.3895313892515355e38, "F16": 65504.0, "F32": 3.4028234663852886e38}  # largest finite values
E2M1_MAX = 6.0  # the largest FP4 magnitude
FP8_MAX = 448.0  # the largest float8_e4m3fn value


@dataclass(frozen=True)
class BlockScaleStats:
    nan: int
    negative: int
    zero: int
    raw: bytes = field(repr=False, compare=False)

    def largest(self) -> float:
        """The largest positive, non-NaN block scale (0.0 when there is none); asked only when it matters."""
        return e4m3_value(next((code for code in range(0x7E, 0, -1) if code in self.raw), 0))  # codes order like values


def read_f32_scalar(path: Path, info: TensorInfo, read: Reader = read_bytes) -> float:
    """The value of a stored float32 scalar ([] or [1])."""
    return struct.unpack("<f", bytes(read(path, info)[:4]))[0]


def block_scale_stats(path: Path, info: TensorInfo, read: Reader = read_bytes) -> BlockScaleStats:
    """Count NaN, negative and zero fp8 block scales (ModelOpt writes 1.0 for all-zero blocks, never 0)."""
    raw = bytes(read(path, info))
    data = raw.translate(_CATEGORY)
    return BlockScaleStats(nan=data.count(3), negative=data.count(2), zero=data.count(0), raw=raw)


def e4m3_value(code: int) -> float:
    """The value of a float8_e4m3fn code (bias 7, no infinities; 0x7F / 0xFF are NaN)."""
    if code & 0x7F == 0x7F:
        return math.nan
    exponent, mantissa = (code >> 3) & 0xF, code & 0x7
    value = mantissa / 8 * 2.0**-6 if exponent == 0 else (1 + mantissa / 8) * 2.0 ** (exponent - 7)
    return -value if code & 0x80 else value


def overflow_problem(blocks: BlockScaleStats, global_scale: float, divisor: bool, out_dtype: str) -> str | None:
    """Why the dequantized weight would hold infinities in `out_dtype` (value = fp4 * block * scale_2, or / the
    compressed-tensors global scale): the largest magnitude it can reach, against the dtype's limit."""
    scaled = (lambda block: block / global_scale) if divisor else (lambda block: block * global_scale)
    if E2M1_MAX * scaled(FP8_MAX) <= DTYPE_MAX[out_dtype]:
        return None  # not even the largest possible block scale overflows: the block scales need no look
    with_scale = scaled(blocks.largest())
    peak = E2M1_MAX * with_scale
    if peak <= DTYPE_MAX[out_dtype] and with_scale <= DTYPE_MAX["F32"]:
        return None
    return (f"{'block scale / global scale' if divisor else 'block scale x global scale'} reaches {with_scale:.3g}, "
            f"so dequantized values reach {peak:.3g}, past {out_dtype}'s largest finite value {DTYPE_MAX[out_dtype]:.3g}")


def global_scale_problem(value: float) -> str | None:
    """Why a weight_scale_2 value is unusable, or None when it is a positive finite number."""
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite"
    if value <= 0:
        return f"is {value} (must be > 0)"
    return None
