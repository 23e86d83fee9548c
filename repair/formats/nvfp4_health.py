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

import numpy as np

from repair.io.ranges import read_bytes
from repair.io.safetensors import TensorInfo

# float8_e4m3fn: 0x7F / 0xFF are NaN, 0x00 / 0x80 are +-0, a set bit 7 is negative.
Reader = Callable[[Path, TensorInfo], bytearray]  # read_bytes, or a RangeReader
_CATEGORY = bytes(3 if b & 0x7F == 0x7F else 0 if b & 0x7F == 0 else 2 if b & 0x80 else 1 for b in range(256))


DTYPE_MAX = {"BF16": 3.3895313892515355e38, "F16": 65504.0, "F32": 3.4028234663852886e38}  # largest finite values
E2M1_MAX = 6.0  # the largest FP4 magnitude
FP8_MAX = 448.0  # the largest float8_e4m3fn value
STATS_PIECE = 1 << 20  # block-scale bytes `block_scale_stats` counts at a time
SAMPLE_BYTES = 64  # per window of a block-scale sample (see sample_windows)


@dataclass(frozen=True)
class BlockScaleStats:
    """NaN, negative and zero fp8 block scales among `count` read (a sample, or every one when `count` is the tensor's)."""

    nan: int
    negative: int
    zero: int
    count: int = 0
    raw: bytes = field(default=b"", repr=False, compare=False)  # kept only while the largest code may still be asked

    def largest(self) -> float:
        """The largest positive, non-NaN block scale (0.0 when there is none); asked only when it matters."""
        return e4m3_value(next((code for code in range(0x7E, 0, -1) if code in self.raw), 0))  # codes order like values


def read_f32_scalar(path: Path, info: TensorInfo, read: Reader = read_bytes) -> float:
    """The value of a stored float32 scalar ([] or [1])."""
    return struct.unpack("<f", bytes(read(path, info)[:4]))[0]


def block_scale_stats(path: Path, info: TensorInfo, read: Reader = read_bytes) -> BlockScaleStats:
    """Count NaN, negative and zero fp8 block scales (ModelOpt writes 1.0 for all-zero blocks, never 0), a piece at a
    time: memory holds one piece, not the tensor (3-D experts' grow with E: gpt-oss-120b's gate_up_proj has 133 MB).
    `raw` keeps each code present once, all that `largest` and `scale_values.nvfp4_problem` ask of it."""
    counts = np.zeros(256, dtype=np.int64)
    for lo in range(info.start, info.end, STATS_PIECE):
        piece = TensorInfo(info.name, info.dtype, info.shape, lo, min(info.end, lo + STATS_PIECE), info.path)
        counts += np.bincount(np.frombuffer(read(path, piece), dtype=np.uint8), minlength=256)
    kinds = np.frombuffer(_CATEGORY, dtype=np.uint8)
    nan, negative, zero = (int(counts[kinds == k].sum()) for k in (3, 2, 0))
    return BlockScaleStats(nan, negative, zero, info.nbytes, np.nonzero(counts)[0].astype(np.uint8).tobytes())


def stats_of(raw: bytes, keep: bool = True) -> BlockScaleStats:
    """The counts of one run of fp8 codes. Healthy codes are 0x01-0x7E: ASCII without NUL and DEL, which three
    C-speed passes (isascii, two memchr) rule out before anything is counted byte by byte."""
    if raw.isascii() and 0 not in raw and 0x7F not in raw:
        return BlockScaleStats(0, 0, 0, len(raw), raw if keep else b"")
    data = raw.translate(_CATEGORY)
    return BlockScaleStats(data.count(3), data.count(2), data.count(0), len(raw), raw if keep else b"")


def sample_windows(info: TensorInfo, width: int = SAMPLE_BYTES) -> list[tuple[int, int]]:
    """The byte ranges a sample of `info` reads: its first and its last `width` bytes (all of it when that is less).
    A tensor of NaN or zeros shows in either; a tail of zeros (a download cut short into a preallocated file) in
    the last."""
    if info.nbytes <= 2 * width:
        return [(info.start, info.end)]
    return [(info.start, info.start + width), (info.end - width, info.end)]


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
    if not may_overflow(global_scale, divisor, out_dtype):
        return None  # not even the largest possible block scale overflows: the block scales need no look
    with_scale = blocks.largest() / global_scale if divisor else blocks.largest() * global_scale
    peak = E2M1_MAX * with_scale
    if peak <= DTYPE_MAX[out_dtype] and with_scale <= DTYPE_MAX["F32"]:
        return None
    return (f"{'block scale / global scale' if divisor else 'block scale x global scale'} reaches {with_scale:.3g}, "
            f"so dequantized values reach {peak:.3g}, past {out_dtype}'s largest finite value {DTYPE_MAX[out_dtype]:.3g}")


def may_overflow(global_scale: float, divisor: bool, out_dtype: str = "BF16") -> bool:
    """Whether some block scale could make this global scale's values pass `out_dtype`'s range: only then do the
    block scales' values matter to overflow_problem (a NaN global scale is its own finding)."""
    with_largest = FP8_MAX / global_scale if divisor else FP8_MAX * global_scale
    return not E2M1_MAX * with_largest <= DTYPE_MAX[out_dtype]


def global_scale_problem(value: float) -> str | None:
    """Why a weight_scale_2 value is unusable, or None when it is a positive finite number."""
    if math.isnan(value):
        return "is NaN"
    if math.isinf(value):
        return "is infinite"
    if value <= 0:
        return f"is {value} (must be > 0)"
    return None
