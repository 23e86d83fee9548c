"""NVFP4 (ModelOpt layout) dequantize and quantize, bit-exact with ModelOpt's `NVFP4QTensor`.

Layout: `weight` uint8 [out, in/2] with the even element in the low nibble, `weight_scale`
float8_e4m3fn [out, in/16], `weight_scale_2` float32 scalar. Value = E2M1[nibble] *
(float(weight_scale) * weight_scale_2), computed in float32 and rounded once to the output
dtype, exactly in ModelOpt's order of operations. Work is done in row chunks so a huge tensor
never needs several full-size float32 copies at once.
"""

from __future__ import annotations

import torch

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FP8_MIN_SCALE = 2.0**-9  # ModelOpt >= 0.45 clamps block scales to [2^-9, 448] before the FP8 cast
CHUNK_ELEMENTS = 1 << 22  # logical elements per chunk: bounds float32 temporaries to ~16 MiB each

E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)
# Byte -> (low-nibble value, high-nibble value): one gather unpacks two elements.
_BYTE_TO_PAIR = torch.stack([E2M1_VALUES[torch.arange(256) & 0xF], E2M1_VALUES[torch.arange(256) >> 4]], dim=-1)
_ROUND_UP_AT = (0.75, 1.75, 3.5)  # ties that round to the even (upper) code
_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)


def _row_chunks(rows: int, cols: int):
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


def dequantize(
    packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """Unpack and scale an NVFP4 weight [out, in/2] to `dtype` [out, in]; bitwise equal to ModelOpt."""
    rows, half = packed.shape
    cols = half * 2
    per_block = weight_scale.to(torch.float32) * weight_scale_2.to(torch.float32)
    out = torch.empty((rows, cols), dtype=dtype)
    for lo, hi in _row_chunks(rows, cols):
        values = _BYTE_TO_PAIR[packed[lo:hi].long()].view(hi - lo, cols // BLOCK, BLOCK)
        out[lo:hi] = (values * per_block[lo:hi].unsqueeze(-1)).view(hi - lo, cols).to(dtype)
    return out


def global_scale(weight: torch.Tensor) -> torch.Tensor:
    """ModelOpt's `weight_scale_2`: amax(|w|) / (6 * 448) as a float32 scalar."""
    return weight.abs().amax().float() / (E2M1_MAX * E4M3_MAX)


def block_scales(weight: torch.Tensor, weight_scale_2: torch.Tensor) -> torch.Tensor:
    """Per-block FP8 scales: block_amax / (6 * weight_scale_2), zero blocks -> 1, clamped, cast to E4M3."""
    rows, cols = weight.shape
    divisor = E2M1_MAX * weight_scale_2.to(torch.float32)
    out = torch.empty((rows, cols // BLOCK), dtype=torch.float8_e4m3fn)
    for lo, hi in _row_chunks(rows, cols):
        amax = weight[lo:hi].view(hi - lo, cols // BLOCK, BLOCK).abs().amax(-1).float()
        scale = amax / divisor
        scale[scale == 0] = 1.0
        out[lo:hi] = scale.clamp(min=FP8_MIN_SCALE, max=E4M3_MAX).to(torch.float8_e4m3fn)
    return out


def quantize(
    weight: torch.Tensor, weight_scale_2: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize [out, in] to (packed uint8, fp8 block scales, fp32 scale_2); byte-identical to ModelOpt.

    Pass `weight_scale_2` to share one global scale across fused siblings (q/k/v, gate/up).
    """
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"input dim {cols} is not a multiple of {BLOCK}")
    scale_2 = global_scale(weight) if weight_scale_2 is None else weight_scale_2.to(torch.float32).reshape(())
    scales = block_scales(weight, scale_2)
    packed = torch.empty((rows, cols // 2), dtype=torch.uint8)
    for lo, hi in _row_chunks(rows, cols):
        block = weight[lo:hi].view(hi - lo, cols // BLOCK, BLOCK)
        scaled = (block / (scales[lo:hi].to(torch.float32) * scale_2).unsqueeze(-1)).view(hi - lo, cols)
        codes = _e2m1_codes(scaled)
        packed[lo:hi] = (codes[:, 1::2] << 4) | codes[:, 0::2]
    return packed, scales, scale_2


def _e2m1_codes(scaled: torch.Tensor) -> torch.Tensor:
    """Round to the nearest E2M1 code, ties to even, sign in bit 3 (a negative that rounds to 0 is -0)."""
    sign = (scaled < 0).to(torch.uint8) << 3
    magnitude = scaled.abs()
    code = torch.searchsorted(_BOUNDS, magnitude, out_int32=True).to(torch.uint8)
    for tie in _ROUND_UP_AT:
        code += magnitude == tie
    return code | sign


def canonical_codes(packed: torch.Tensor) -> torch.Tensor:
    """Map the -0 code (8) to +0 in both nibbles, so byte comparisons ignore the sign of zero.

    ModelOpt writes -0 for small negatives but dequantizes it to +0, so a dequantize/requantize
    round trip is only byte-identical after this normalisation.
    """
    low, high = packed & 0xF, packed >> 4
    low = torch.where(low == 8, 0, low)
    high = torch.where(high == 8, 0, high)
    return (high << 4) | low
