"""Output-dtype bit patterns <-> float32, on numpy: the roundings torch applies on the CPU.

bf16/f16 outputs are handled as uint16 bit patterns (numpy has no bfloat16), f32 as uint32.
Every conversion to float32 is exact; conversions from float32 round to nearest even once.
"""

from __future__ import annotations

import numpy as np

from repair.codec.dequant_table import OUT_DTYPES, to_bf16_bits

BITS = {"BF16": np.uint16, "F16": np.uint16, "F32": np.uint32}


def check(out_dtype: str) -> None:
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"dequantize writes {', '.join(OUT_DTYPES)}, not {out_dtype}")


def to_float32(bits: np.ndarray, out_dtype: str) -> np.ndarray:
    """Bit patterns of `out_dtype` -> their float32 values (exact)."""
    if out_dtype == "BF16":
        return (bits.astype(np.uint32) << 16).view(np.float32)
    return bits.view(np.float16).astype(np.float32) if out_dtype == "F16" else bits.view(np.float32)


def from_float32(values: np.ndarray, out_dtype: str) -> np.ndarray:
    """float32 values -> `out_dtype` bit patterns, rounded once (bf16 NaN -> 0xFFFF, as torch on CPU)."""
    if out_dtype == "BF16":
        return to_bf16_bits(values)
    return (values.astype(np.float16) if out_dtype == "F16" else values).view(BITS[out_dtype])
