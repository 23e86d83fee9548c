"""doctor decides which modules' block scales it must read whole from every module's global scale at once
(scale_values.nvfp4_codes_needed_many, #27: 45k modules on DeepSeek-R1); the answer is nvfp4_codes_needed's, value
by value, on the float32 values where it changes (both ends of the range, subnormals, NaN, infinities)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from repair.codec.scale_values import nvfp4_codes_needed, nvfp4_codes_needed_many

F32 = st.floats(width=32, allow_nan=True, allow_infinity=True)
EDGES = [0.0, -0.0, 1e-45, 1e-40, 1.2e-38, 1e-30, 2.0**-133, 2.0**-126, 5e-4, 1.0, 1e30, 7.6e35, 1.3e36, 3.4e38,
         float("inf"), float("-inf"), float("nan"), -1.0]


def _neighbours(value: float) -> list[float]:
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return [struct.unpack("<f", struct.pack("<I", (bits + d) & 0xFFFFFFFF))[0] for d in (-1, 0, 1)]


@settings(max_examples=60, deadline=None)
@given(values=st.lists(F32, max_size=40), divisor=st.booleans(), out_dtype=st.sampled_from(["BF16", "F16", "F32"]))
def test_many_equals_one_by_one(values, divisor, out_dtype):
    values = values + [n for v in EDGES for n in _neighbours(v)]
    many = nvfp4_codes_needed_many(values, divisor, out_dtype, rows=7)  # rows: the chunking must not matter
    assert many.tolist() == [nvfp4_codes_needed(v, divisor, out_dtype) for v in values]


def _flip(low: int, high: int, divisor: bool) -> int:
    """The float32 bit pattern in (low, high] where nvfp4_codes_needed changes (bisection; it changes once there)."""
    value = lambda bits: struct.unpack("<f", struct.pack("<I", bits))[0]  # noqa: E731
    first = nvfp4_codes_needed(value(low), divisor, "BF16")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if nvfp4_codes_needed(value(mid), divisor, "BF16") == first else (low, mid)
    return high


def test_the_thresholds_are_found_exactly():
    """Every float32 around both places the answer flips (products rounding to 0, products overflowing BF16)."""
    one = 0x3F800000
    for divisor in (False, True):
        flips = [_flip(1, one, divisor), _flip(one, 0x7F7FFFFF, divisor)]
        assert len(set(flips)) == 2
        for flip in flips:
            bits = np.arange(flip - 5000, flip + 5000, dtype=np.uint32)
            values = bits.view(np.float32).astype(float).tolist()
            want = [nvfp4_codes_needed(v, divisor, "BF16") for v in values]
            assert len(set(want)) == 2 and nvfp4_codes_needed_many(values, divisor, "BF16").tolist() == want


@settings(max_examples=200, deadline=None)
@given(codes=st.lists(st.integers(0, 255), min_size=1, max_size=64), scale_2=F32, divisor=st.booleans(),
       out_dtype=st.sampled_from(["BF16", "F16", "F32"]))
def test_problem_from_the_extreme_codes_equals_the_one_from_every_code(codes, scale_2, divisor, out_dtype):
    """The products grow with the code, so a layer's block scales overflow or round to 0 where their largest or smallest
    code does: nvfp4_problem may decide from those two (a pass each, not a scatter of every code), same answer."""
    from repair.codec import scale_values

    raw = bytes(codes)
    every_code = scale_values.invalid(scale_2) or scale_values.problem_of_codes(scale_values._present(raw), scale_2, divisor, out_dtype)
    assert scale_values.nvfp4_problem(raw, scale_2, divisor, out_dtype) == every_code


def test_healthy_block_scales_are_judged_without_listing_every_code(monkeypatch):
    """The plan-time check and the writer ask this of every module's block scales (1/16 of the weights): where every
    code is a positive number and neither end has a problem, no per-code work is done."""
    from repair.codec import scale_values

    raw = np.random.default_rng(0).integers(0x30, 0x40, size=1 << 16, dtype=np.uint8).tobytes()
    monkeypatch.setattr(scale_values, "_present", lambda codes: pytest.fail("listed every code"))
    assert scale_values.nvfp4_problem(raw, 5e-4, False, "BF16") is None
