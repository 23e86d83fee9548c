"""FP8 per-tensor (ModelOpt `quant_algo` FP8) dequantize and quantize, exact with ModelOpt.

Layout: `weight` float8_e4m3fn [out, in], `weight_scale` float32 scalar, `input_scale` float32
scalar (activations; untouched here). Value = float(weight) * weight_scale.

- dequantize: ModelOpt's `FP8QTensor.dequantize` rounds the scale to the output dtype and
  multiplies in that dtype; `fp8_table` reproduces it with one 256-entry table (numpy).
- quantize: ModelOpt's HF export takes the weight's amax (max |w|, exact in float32),
  `weight_scale = amax / 448` in float32, then `(weight / weight_scale).to(float8_e4m3fn)`
  where the quotient of a bf16/fp16 weight by a 0-d float32 tensor is rounded to the weight's
  dtype before the FP8 cast. That double rounding decides ties, so it is repeated here.
  Fused siblings (q/k/v, gate/up) share the group's largest scale, which callers pass in.
  One deliberate difference: for an all-zero weight ModelOpt writes scale 0 and NaN bytes
  (0 / 0); we write zero bytes and scale 1.0, which dequantize to the original zeros.
"""

from __future__ import annotations

import torch

from repair.codec import fp8_table
from repair.codec.nvfp4 import _one_thread  # shared: cache-sized chunks run 3-7x faster on one thread (measured)

E4M3_MAX = 448.0
CHUNK_ELEMENTS = 1 << 18  # elements per row chunk: each float32 temporary stays within L2
OUT_DTYPES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """float8_e4m3fn weight (any shape) times its per-tensor scale, in `dtype`; bitwise equal to ModelOpt."""
    if weight.dtype != torch.float8_e4m3fn or weight_scale.numel() != 1 or dtype not in OUT_DTYPES:
        raise ValueError(f"FP8 dequantize takes a float8_e4m3fn weight, one scale and bf16/fp16/fp32 output, "
                         f"not {weight.dtype}, {weight_scale.numel()} scales, {dtype}")
    scale = weight_scale.to(torch.float32).item()
    bits = fp8_table.dequantize(weight.view(torch.uint8).numpy(), scale, OUT_DTYPES[dtype])
    return torch.from_numpy(bits).view(dtype)


def _row_chunks(weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return weight.split(max(1, CHUNK_ELEMENTS // max(weight.shape[1], 1)))


def weight_scale(weight: torch.Tensor) -> torch.Tensor:
    """ModelOpt's `weight_scale`: amax(|w|) / 448 as a float32 scalar (amax is exact in float32)."""
    amax = torch.stack([chunk.abs().amax().float() for chunk in _row_chunks(weight)]).amax()  # NaN propagates
    if not torch.isfinite(amax):
        raise ValueError("the weight has NaN or infinite values; FP8 cannot represent it")
    return amax / E4M3_MAX


def quantize(weight: torch.Tensor, scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16/fp16/fp32 weight -> (float8_e4m3fn weight, float32 0-d weight_scale); byte-identical to ModelOpt's export.

    Pass `scale` to share one weight_scale across fused siblings (q/k/v, gate/up): ModelOpt's
    export gives them the largest amax of the group.
    """
    if weight.dtype not in OUT_DTYPES or weight.dim() != 2:
        raise ValueError(f"FP8 quantize takes a 2-D bf16/fp16/fp32 weight, not {weight.dtype} {tuple(weight.shape)}")
    with _one_thread():
        scale = weight_scale(weight) if scale is None else scale.to(torch.float32).reshape(())
    if scale == 0:  # all zeros: ModelOpt would divide 0 by 0 (see the module docstring)
        return torch.zeros(weight.shape, dtype=torch.uint8).view(torch.float8_e4m3fn), torch.tensor(1.0)
    out = torch.empty(weight.shape, dtype=torch.float8_e4m3fn)
    with _one_thread():
        for chunk, into in zip(_row_chunks(weight), _row_chunks(out)):
            quotient = (chunk.to(torch.float32) / scale).to(weight.dtype)  # rounded to the weight's dtype first
            into.copy_(quotient.to(torch.float8_e4m3fn))
    return out, scale
