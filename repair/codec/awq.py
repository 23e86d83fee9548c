"""NVFP4_AWQ to full precision: dequantize, then fold `pre_quant_scale` into the weight.

ModelOpt's NVFP4_AWQ layer computes `(x * pre_quant_scale) @ W.T`, W being the NVFP4 weight
(smoothed by 1 / pre_quant_scale before quantizing). Its unquantized equivalent without the
input scaling is `x @ (W * pre_quant_scale).T`, one scale per input column. We fold it the way
ModelOpt's own `disable_pre_quant_scale_and_resmooth` does on a model's weight: the weight in
its dtype, times the scale in float32, rounded once back to that dtype. The weight here is
`dequant_table.dequantize`'s output, bitwise ModelOpt's NVFP4 dequantization. numpy only, so
`--target bf16` stays torch-free.
"""

from __future__ import annotations

import numpy as np

from repair.codec import dequant_table, float_bits

CHUNK_ELEMENTS = dequant_table.CHUNK_ELEMENTS


def fold(weight_bits: np.ndarray, pre_quant_scale: np.ndarray, out_dtype: str) -> np.ndarray:
    """Multiply each input column of a [out, in] weight (as `out_dtype` bits) by its scale, in place.

    `pre_quant_scale` holds float32 values [in] (a bf16/fp16 scale converts exactly).
    """
    float_bits.check(out_dtype)
    rows, cols = weight_bits.shape
    scale = np.asarray(pre_quant_scale, dtype=np.float32).reshape(-1)
    if scale.shape != (cols,):
        raise ValueError(f"pre_quant_scale has {scale.size} values for a weight of {cols} input columns")
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    with np.errstate(all="ignore"):  # inf/NaN are data here, as in ModelOpt
        for lo in range(0, rows, step):
            chunk = weight_bits[lo : lo + step]
            chunk[...] = float_bits.from_float32(float_bits.to_float32(chunk, out_dtype) * scale, out_dtype)
    return weight_bits


def dequantize(
    packed: np.ndarray, scale_bytes: np.ndarray, scale_2: float, pre_quant_scale: np.ndarray, out_dtype: str
) -> np.ndarray:
    """NVFP4 packed uint8 [out, in/2] + FP8 scale bytes + scale_2 + pre_quant_scale [in] -> folded bits [out, in]."""
    return fold(dequant_table.dequantize(packed, scale_bytes, scale_2, out_dtype), pre_quant_scale, out_dtype)
