"""FP8 per-tensor dequantize as one 256-entry table lookup, on numpy: no torch import needed.

ModelOpt's FP8 layers (`quant_algo` FP8) store `weight` float8_e4m3fn [out, in] and a float32
scalar `weight_scale`. ModelOpt dequantizes (`FP8QTensor.dequantize`, and the export's
`from_quantized_weight`) in the output dtype: `weight.to(dtype) * scale.to(dtype)`. So the
scale is rounded to the output dtype first, and the product is rounded once more; an FP8
value is exact in every output dtype. With 256 possible bytes, every output value is
`table[byte]`, the table holding exactly those products. The torch API (`fp8.dequantize`)
calls this code, checked bitwise against ModelOpt in tests/test_codec_fp8.py.
"""

from __future__ import annotations

import numpy as np

from repair.codec import float_bits
from repair.codec.dequant_table import FP8_E4M3FN


def byte_table(scale: float, out_dtype: str) -> np.ndarray:
    """[FP8 byte] -> output bits of `float(byte) * scale`, both factors in `out_dtype`, as ModelOpt."""
    float_bits.check(out_dtype)
    with np.errstate(all="ignore"):  # inf/NaN scales and NaN bytes are data here, as in ModelOpt
        factor = float_bits.from_float32(np.array([scale], dtype=np.float32), out_dtype)
        # float32 products as torch computes them (exact but for float32 subnormals), rounded once
        return float_bits.from_float32(FP8_E4M3FN * float_bits.to_float32(factor, out_dtype), out_dtype)


def dequantize(weight_bytes: np.ndarray, scale: float, out_dtype: str) -> np.ndarray:
    """FP8 weight bytes (uint8, any shape) -> output bits of the same shape (uint16 or uint32)."""
    return byte_table(scale, out_dtype)[weight_bytes]
