"""FP8 block 128x128 dequantize (DeepSeek's layout), on numpy: no torch import needed.

A float8_e4m3fn weight [out, in] carries one scale per 128x128 block, [ceil(out/128), ceil(in/128)], in float32 or,
where the checkpoint says `scale_fmt: ue8m0` (DeepSeek-V4), float8_e8m0fnu: one biased exponent per byte, 2^(b-127),
0xFF its NaN. DeepSeek's reference dequantize (`weight_dequant` in its inference code) multiplies each code by its
block's scale in float32 and casts the product to the output dtype once; this does the same, 128 rows at a time, so a
temporary is one row block of float32.
"""

from __future__ import annotations

import numpy as np

from repair.codec import float_bits
from repair.codec.dequant_table import FP8_E4M3FN

BLOCK = 128
FP8_MAX = 448.0  # the largest float8_e4m3fn magnitude
OUT_MAX = {"BF16": 3.3895313892515355e38, "F16": 65504.0, "F32": 3.4028234663852886e38}


def scales(raw: np.ndarray, dtype: str) -> np.ndarray:
    """The block scales as float32 values, from their stored dtype ("F32", or "F8_E8M0" bytes)."""
    if dtype == "F8_E8M0":
        exponents = raw.astype(np.int32) - 127
        with np.errstate(over="ignore"):  # 0xFF (2^128) overflows: it is the NaN, set below
            out = np.ldexp(np.ones(raw.shape, dtype=np.float32), exponents).astype(np.float32)
        out[raw == 0xFF] = np.nan
        return out
    return raw.astype(np.float32, copy=False)


def scale_problem(values: np.ndarray, out_dtype: str) -> str | None:
    """Why these block scales would write garbage that looks fixed (NaN, infinite or not positive, or the largest code
    times the largest scale past `out_dtype`'s range), else None."""
    nan = int(np.count_nonzero(np.isnan(values)))
    if nan:
        return f"{nan} of {values.size} block scales are NaN"
    bad = int(np.count_nonzero(~np.isfinite(values) | (values <= 0)))
    if bad:
        return f"{bad} of {values.size} block scales are infinite or not positive"
    peak = FP8_MAX * float(values.max()) if values.size else 0.0
    if peak > OUT_MAX[out_dtype]:
        return f"the largest code times the largest block scale ({peak:.4g}) would overflow {out_dtype}"
    return None


def e8m0_inexact(values: np.ndarray) -> int:
    """How many positive finite float32 scales a float8_e8m0fnu parameter cannot hold: not a power of two, or outside
    2^-127..2^127 (a dtype-converting copy rounds them: torch 2.13 measured 1.3 * 2^-9 -> 2^-9, 1.5 * 2^-9 -> 2^-8)."""
    held = values[np.isfinite(values) & (values > 0)]
    mantissa, exponent = np.frexp(held)  # value = mantissa * 2^exponent, mantissa in [0.5, 1)
    return int(np.count_nonzero((mantissa != 0.5) | (exponent - 1 < -127) | (exponent - 1 > 127)))


def dequantize(codes: np.ndarray, block_scales: np.ndarray, out_dtype: str) -> np.ndarray:
    """float8_e4m3fn codes (uint8 [out, in]) and float32 block scales -> output bits [out, in] (uint16 or uint32)."""
    float_bits.check(out_dtype)
    rows, cols = codes.shape
    out = np.empty((rows, cols), dtype=float_bits.BITS[out_dtype])
    for b, start in enumerate(range(0, rows, BLOCK)):
        factors = np.repeat(block_scales[b], BLOCK)[:cols]
        with np.errstate(all="ignore"):
            out[start:start + BLOCK] = float_bits.from_float32(FP8_E4M3FN[codes[start:start + BLOCK]] * factors, out_dtype)
    return out
