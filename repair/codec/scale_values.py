"""Scale checks on the values the dequantizer multiplies by, after rounding (issue 25.9); numpy only.

A float32 scale that is "> 0" can still be a broken one: FP8's `weight_scale` is rounded to the output dtype
before it multiplies (fp8_table), so 1e-45 becomes 0 in BF16 and the layer would be written as zeros; NVFP4
multiplies every block scale by `weight_scale_2` in float32 (dequant_table), which can underflow to 0 or overflow;
NVFP4_AWQ folds `pre_quant_scale` into the dequantized weight and rounds once (awq.fold). doctor, the plan-time
checks and the writer all call these functions, with the same inputs, so `--dry-run` accepts exactly what the real
run writes. Each returns None, or why the scale is unusable (the caller names the tensor).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from repair.codec import float_bits, fp8_table
from repair.codec.dequant_table import FP8_E4M3FN, non_finite

E2M1_MAX = np.float32(6.0)
NAN_CODES = (0x7F, 0xFF)
_POSITIVE = np.array([0 < c < 0x7F for c in range(256)])  # float8_e4m3fn codes of positive, non-NaN values


@dataclass(frozen=True)
class ScaleProblem:
    kind: str  # "invalid" (NaN, infinite, not positive), "zero" (rounds away the values) or "overflow"
    text: str


def _rounded(values: np.ndarray, out_dtype: str) -> np.ndarray:
    """float32 values as `out_dtype` rounds them, back in float32 (exact)."""
    with np.errstate(all="ignore"):
        return float_bits.to_float32(float_bits.from_float32(np.asarray(values, dtype=np.float32), out_dtype), out_dtype)


def invalid(value: float) -> ScaleProblem | None:
    """A float32 scale that is NaN, infinite or not positive."""
    v = np.float32(value)
    if np.isnan(v):
        return ScaleProblem("invalid", "is NaN")
    if np.isinf(v):
        return ScaleProblem("invalid", "is infinite")
    if v <= 0:
        return ScaleProblem("invalid", f"is {float(v)} (must be > 0)")
    return None


def fp8_problem(scale: float, out_dtype: str, codes: Callable[[], Iterable[int]]) -> ScaleProblem | None:
    """An FP8 per-tensor weight_scale: the value it rounds to in `out_dtype` must be positive and finite, and so must
    its products with the weight's codes. `codes()` (the bytes the weight holds) is called only when one could
    overflow: real scales are far smaller."""
    bad = invalid(scale)
    if bad:
        return bad
    factor = float(_rounded(np.array([scale]), out_dtype)[0])
    if factor == 0:
        return ScaleProblem("zero", f"is {scale:.3g}, which rounds to 0 in {out_dtype}, so every dequantized value would be 0")
    if not np.isfinite(factor):
        return ScaleProblem("overflow", f"is {scale:.3g}, which rounds to infinity in {out_dtype}")
    over = non_finite(fp8_table.byte_table(scale, out_dtype), out_dtype)
    over[list(NAN_CODES)] = False
    if not over.any():
        return None
    hit = [int(c) for c in set(codes()) if over[int(c)]]
    if not hit:
        return None
    peak = max(float(abs(FP8_E4M3FN[c])) for c in hit) * factor
    return ScaleProblem("overflow", f"{scale:.3g} makes dequantized values reach {peak:.3g}, past {out_dtype}'s largest "
                                    f"finite value")


def fp8_codes_needed(scale: float, out_dtype: str) -> bool:
    """Whether fp8_problem would ask for the weight's codes (the Hub fetches them by range only then)."""
    if invalid(scale) or not np.isfinite(_rounded(np.array([scale]), out_dtype)[0]):
        return False
    over = non_finite(fp8_table.byte_table(scale, out_dtype), out_dtype)
    over[list(NAN_CODES)] = False
    return bool(over.any())


def _per_block(codes: np.ndarray, scale_2: float, divisor: bool) -> np.ndarray:
    """float32 block scale x global scale (or / the compressed-tensors global scale), as dequant_table multiplies."""
    with np.errstate(all="ignore"):
        return FP8_E4M3FN[codes] / np.float32(scale_2) if divisor else FP8_E4M3FN[codes] * np.float32(scale_2)


def _present(block_codes: bytes | bytearray) -> np.ndarray:
    """The positive, non-NaN block-scale codes that occur (zero, negative and NaN ones are doctor's own findings)."""
    seen = np.zeros(256, dtype=bool)
    seen[np.frombuffer(bytes(block_codes), dtype=np.uint8)] = True
    return np.nonzero(seen & _POSITIVE)[0]


def nvfp4_problem(block_codes: bytes | bytearray, scale_2: float, divisor: bool, out_dtype: str) -> ScaleProblem | None:
    """NVFP4's global scale: every block's largest value, E2M1 6 x (block scale x scale_2) in float32 rounded to
    `out_dtype`, must be finite; the float32 product must not be 0 where the block scale is not, and the layer's
    largest value must not round to 0 (a few near-zero blocks below F16's range are F16's limit, not a broken scale).

    The products grow with the code, so where every code is a positive number the smallest and the largest decide
    whether there is a problem (two passes); only a problem's text, which counts codes, lists every code present."""
    bad = invalid(scale_2)
    if bad:
        return bad
    codes = np.frombuffer(block_codes, dtype=np.uint8)
    if codes.size:
        ends = np.array([codes.min(), codes.max()])
        if _POSITIVE[ends].all() and problem_of_codes(ends, scale_2, divisor, out_dtype) is None:
            return None
    return problem_of_codes(_present(block_codes), scale_2, divisor, out_dtype)


def problem_of_codes(codes: np.ndarray, scale_2: float, divisor: bool, out_dtype: str) -> ScaleProblem | None:
    """nvfp4_problem of the distinct positive, non-NaN codes present (ascending), with a valid global scale."""
    if not codes.size:
        return None
    op = "block scale / global scale" if divisor else "block scale x global scale"
    with np.errstate(all="ignore"):
        peaks = _rounded(E2M1_MAX * _per_block(codes, scale_2, divisor), out_dtype)
    over = ~np.isfinite(peaks)
    if over.any():
        reach = float(_per_block(codes[over][-1:], scale_2, divisor)[0])
        return ScaleProblem("overflow", f"{op} reaches {reach:.3g}, so dequantized values reach {6 * reach:.3g}, past "
                                        f"{out_dtype}'s largest finite value")
    zero = _per_block(codes, scale_2, divisor) == 0
    if zero.any() or peaks.max() == 0:
        where = f"float32 for {int(zero.sum())} of the" if zero.any() else f"{out_dtype} for all"
        return ScaleProblem("zero", f"{op} rounds to 0 in {where} {codes.size} block-scale value(s) stored (global scale "
                                    f"{scale_2:.3g}), so those blocks dequantize to 0")
    return None


_ALL_POSITIVE = bytes(range(1, 0x7F))  # every positive, non-NaN float8_e4m3fn block-scale code


def nvfp4_codes_needed(scale_2: float, divisor: bool, out_dtype: str) -> bool:
    """Whether nvfp4_problem could find a problem in some set of block scales with this global scale, so the block
    scales must be read whole to know: the largest code may overflow, or the smallest round to 0 (both monotone in the
    code, so a stored subset can only fail where these do)."""
    if invalid(scale_2):
        return False
    return bool(nvfp4_problem(_ALL_POSITIVE, scale_2, divisor, out_dtype) or nvfp4_problem(b"\x01", scale_2, divisor, out_dtype))


def nvfp4_codes_needed_many(scales_2: Iterable[float], divisor: bool, out_dtype: str, rows: int = 4096) -> np.ndarray:
    """nvfp4_codes_needed of many global scales at once, as one array operation per `rows` of them (doctor asks it of
    every NVFP4 module: 45k on DeepSeek-R1). The same float32 products and roundings as nvfp4_problem, element by
    element: some positive code overflows, or its product is 0, or the largest peak or code 1's rounds to 0."""
    values = np.asarray(list(scales_2), dtype=np.float32).reshape(-1)
    out = np.zeros(values.shape, dtype=bool)
    codes = FP8_E4M3FN[np.frombuffer(_ALL_POSITIVE, dtype=np.uint8)][np.newaxis]
    for at in range(0, values.size, rows):
        s = values[at:at + rows, np.newaxis]
        with np.errstate(all="ignore"):
            per_block = codes / s if divisor else codes * s
            peaks = _rounded(E2M1_MAX * per_block, out_dtype)
        problem = ~np.isfinite(peaks).all(axis=1) | (per_block == 0).any(axis=1) | (peaks.max(axis=1) == 0) | (peaks[:, 0] == 0)
        out[at:at + rows] = problem & np.isfinite(s[:, 0]) & (s[:, 0] > 0)
    return out


def nvfp4_peak(block_codes: bytes | bytearray, scale_2: float, divisor: bool, out_dtype: str) -> float:
    """The largest magnitude an NVFP4 weight dequantizes to in `out_dtype` (0.0 when no block scale is positive)."""
    codes = _present(block_codes)
    if not codes.size:
        return 0.0
    with np.errstate(all="ignore"):
        return float(_rounded(E2M1_MAX * _per_block(codes, scale_2, divisor), out_dtype).max())


def pre_quant_scale_problem(values: np.ndarray, peak: float, out_dtype: str) -> ScaleProblem | None:
    """NVFP4_AWQ's per-input-column scale, folded as the weight (in `out_dtype`) times it, rounded once: each must be
    positive and finite, and the layer's largest weight (`peak`) times it must round to neither 0 nor infinity."""
    scale = np.asarray(values, dtype=np.float32).reshape(-1)
    broken = np.nonzero(~np.isfinite(scale) | (scale <= 0))[0]
    if broken.size:
        i = int(broken[0])
        return ScaleProblem("invalid", f"column {i} is {float(scale[i])} (every pre_quant_scale must be positive and "
                                       "finite; folding it would erase, negate or poison that input channel)")
    if peak == 0:
        return None
    with np.errstate(all="ignore"):
        folded = _rounded(_rounded(np.array([peak]), out_dtype)[0] * scale, out_dtype)
    for kind, where, what in (("overflow", ~np.isfinite(folded), "overflows"), ("zero", folded == 0, "rounds to 0")):
        hit = np.nonzero(where)[0]
        if hit.size:
            i = int(hit[0])
            return ScaleProblem(kind, f"column {i} is {float(scale[i]):.3g}: the layer's largest weight ({peak:.3g}) times it "
                                      f"{what} in {out_dtype}, so folding it would {'write infinities' if kind == 'overflow' else 'erase that input channel'}")
    return None


def kv_scale_problem(value: float) -> ScaleProblem | None:
    """A k_scale / v_scale: the runtime divides every cached key or value by it, so beyond positive and finite,
    its float32 reciprocal must be finite (a subnormal scale turns a key of 1.0 into infinity)."""
    bad = invalid(value)
    if bad:
        return bad
    with np.errstate(all="ignore"):
        if not np.isfinite(np.float32(1.0) / np.float32(value)):
            return ScaleProblem("zero", f"is {value:.3g}: the runtime divides every cached key or value by it, and even 1.0 "
                                        "divided by it overflows float32")
    return None
