"""NVFP4 (ModelOpt layout) dequantize and quantize, bit-exact with ModelOpt's `NVFP4QTensor`.

Layout: `weight` uint8 [out, in/2] with the even element in the low nibble, `weight_scale`
float8_e4m3fn [out, in/16], `weight_scale_2` float32 scalar. Value = E2M1[nibble] *
(float(weight_scale) * weight_scale_2), computed in float32 and rounded once to the output
dtype, exactly in ModelOpt's order of operations.

Both directions are table lookups computed with ModelOpt's own arithmetic, which is why they are
exact and several times faster than ModelOpt (BENCHMARKS.md):
- dequantize: a block scale is one of 256 FP8 bit patterns and a byte one of 256 nibble pairs, so
  each output pair is `table[scale byte, packed byte]`; the 65,536 entries are ModelOpt's float32
  products rounded to the output dtype, built once per tensor (`dequant_table`, in numpy, so the
  executor can dequantize without importing torch).
- quantize: the E2M1 code of a float32 depends only on its sign, exponent, top two mantissa bits
  and whether its 21 lower bits are all zero (every rounding bound is such a number), so it is
  `table[class of its bits]` over 4,096 classes, filled by ModelOpt's searchsorted rule.
Work is done in row chunks sized for the L2 cache, on one thread (see `_one_thread`).
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import torch

from repair.codec import dequant_table

BLOCK = 16
E2M1_MAX = 6.0
E4M3_MAX = 448.0
FP8_MIN_SCALE = 2.0**-9  # ModelOpt >= 0.45 clamps block scales to [2^-9, 448] before the FP8 cast
CHUNK_ELEMENTS = 1 << 18  # logical elements per chunk: each temporary stays within L2 (<= 1 MiB)

E2M1_VALUES = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=torch.float32)
# Byte -> (low-nibble value, high-nibble value): one gather unpacks two elements.
_BYTE_TO_PAIR = torch.stack([E2M1_VALUES[torch.arange(256) & 0xF], E2M1_VALUES[torch.arange(256) >> 4]], dim=-1)
# compressed-tensors' unpack_fp4_from_uint8 keeps the sign of code 8 (-0.0), where ModelOpt gives +0.
_SIGNED_PAIR = torch.where((torch.arange(256).unsqueeze(-1) >> torch.tensor([0, 4]) & 0xF) == 8, -0.0, _BYTE_TO_PAIR)
_ROUND_UP_AT = (0.75, 1.75, 3.5)  # ties that round to the even (upper) code
_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], dtype=torch.float32)
_BITS = {torch.bfloat16: (torch.int16, 0x7FFF), torch.float16: (torch.int16, 0x7FFF), torch.float32: (torch.int32, 0x7FFFFFFF)}


def _row_chunks(rows: int, cols: int):
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    for start in range(0, rows, step):
        yield start, min(rows, start + step)


@contextmanager
def _one_thread():
    """Run the chunk loop's torch ops on the calling thread only.

    Chunks are cache-sized, so a second OpenMP thread gains little, and `fix` keeps the other
    cores busy hashing and copying; measured on a loaded 2-core machine, ops split across two
    OpenMP threads ran 5-10x slower while one waited for a busy core.
    """
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if threads > 1:
            torch.set_num_threads(threads)


def dequantize(
    packed: torch.Tensor, weight_scale: torch.Tensor, weight_scale_2: torch.Tensor, dtype: torch.dtype = torch.bfloat16,
    *, divisor: bool = False,
) -> torch.Tensor:
    """Unpack and scale an NVFP4 weight [out, in/2] to `dtype` [out, in]; bitwise equal to ModelOpt.

    The table path is `dequant_table` (numpy, shared with the torch-free executor path).
    divisor=True: the global scale divides (compressed-tensors' weight_global_scale); see dequantize_ct.
    A 3-D [E, in/2, out] weight with [E, in/16, out] scales is ModelOpt's transposed BMM experts layout (formats/
    nvfp4_packed.py `_bmm_experts`): each expert is its [out, in] Linear transposed, so it dequantizes to [E, in, out]
    (`dequant_table.dequantize_experts`, expert by expert into one output).
    """
    name = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}.get(dtype)
    experts = packed.dim() == 3
    half = packed.shape[1]  # in/2: [out, in/2] or [E, in/2, out]
    blocks = (packed.shape[0], half * 2 // BLOCK, packed.shape[2]) if experts else (packed.shape[0], half * 2 // BLOCK)
    if packed.dtype != torch.uint8 or weight_scale.dtype != torch.float8_e4m3fn or weight_scale.shape != blocks or weight_scale_2.numel() != 1 or name is None:
        if experts:  # per expert, the arithmetic form: layouts the table does not take
            return torch.stack([dequantize(p.t().contiguous(), s.t().contiguous(), weight_scale_2, dtype, divisor=divisor).t()
                                for p, s in zip(packed, weight_scale)])
        return _dequantize_direct(packed, weight_scale, weight_scale_2, dtype, divisor)
    scale_2 = weight_scale_2.to(torch.float32).item()
    table = dequant_table.dequantize_experts if experts else dequant_table.dequantize
    bits = table(packed.numpy(), weight_scale.view(torch.uint8).numpy(), scale_2, name, divisor)
    return torch.from_numpy(bits).view(dtype)


def _per_block(scale: torch.Tensor, global_scale: torch.Tensor, divisor: bool) -> torch.Tensor:
    """ModelOpt: float(weight_scale) * weight_scale_2; compressed-tensors: float(weight_scale) / weight_global_scale."""
    return scale / global_scale if divisor else scale * global_scale


def _dequantize_direct(packed, weight_scale, weight_scale_2, dtype, divisor: bool = False):
    """The arithmetic form, for scales that are not FP8 or output dtypes of other widths."""
    rows, half = packed.shape
    cols = half * 2
    per_block = _per_block(weight_scale.to(torch.float32), weight_scale_2.to(torch.float32), divisor)
    out = torch.empty((rows, cols), dtype=dtype)
    for lo, hi in _row_chunks(rows, cols):
        values = (_SIGNED_PAIR if divisor else _BYTE_TO_PAIR)[packed[lo:hi].long()].view(hi - lo, cols // BLOCK, BLOCK)
        out[lo:hi] = (values * per_block[lo:hi].unsqueeze(-1)).view(hi - lo, cols).to(dtype)
    return out


def dequantize_ct(
    packed: torch.Tensor, weight_scale: torch.Tensor, weight_global_scale: torch.Tensor, dtype: torch.dtype = torch.bfloat16
) -> torch.Tensor:
    """compressed-tensors nvfp4-pack-quantized: E2M1 * (float32(fp8) / weight_global_scale), rounded once.

    Bitwise equal to NVFP4PackedCompressor.decompress when the global scale has shape [1] (its own
    layout; code 8 gives -0.0 as there) and, -0 aside, to ModelOpt's value for weight_scale_2 =
    1 / weight_global_scale. With a 0-d global scale (what CT's ModelOpt converter writes) CT's
    decompress rounds the block scale to bf16 first and is up to 1 ulp off; we do not copy that.
    """
    return dequantize(packed, weight_scale, weight_global_scale, dtype, divisor=True)


def global_scale(weight: torch.Tensor) -> torch.Tensor:
    """ModelOpt's `weight_scale_2`: amax(|w|) / (6 * 448) as a float32 scalar."""
    if weight.dtype in _BITS and weight.numel() and weight.shape[-1] % BLOCK == 0:
        with _one_thread():
            return _block_amax(weight.reshape(-1, weight.shape[-1])).amax().float() / (E2M1_MAX * E4M3_MAX)
    return weight.abs().amax().float() / (E2M1_MAX * E4M3_MAX)


def _block_amax(weight: torch.Tensor) -> torch.Tensor:
    """max |w| over each 16-element block [rows, cols/16], in weight's dtype.

    On the bit patterns with the sign cleared, which order like the magnitudes (a NaN sorts
    above inf, so a block with one still yields NaN): much faster than a float abs().amax().
    """
    rows, cols = weight.shape
    bits, magnitude = _BITS[weight.dtype]
    out = torch.empty((rows, cols // BLOCK), dtype=bits)
    for lo, hi in _row_chunks(rows, cols):
        block = weight[lo:hi].reshape(hi - lo, cols // BLOCK, BLOCK).view(bits) & magnitude
        torch.amax(block, -1, out=out[lo:hi])
    return out.view(weight.dtype)


def block_scales(weight: torch.Tensor, weight_scale_2: torch.Tensor) -> torch.Tensor:
    """Per-block FP8 scales: block_amax / (6 * weight_scale_2), zero blocks -> 1, clamped, cast to E4M3."""
    rows, cols = weight.shape
    if weight.dtype in _BITS:
        with _one_thread():
            return _scales_from_amax(_block_amax(weight), weight_scale_2)
    return _scales_from_amax(weight.view(rows, cols // BLOCK, BLOCK).abs().amax(-1), weight_scale_2)


def _scales_from_amax(amax: torch.Tensor, weight_scale_2: torch.Tensor) -> torch.Tensor:
    scale = amax.float() / (E2M1_MAX * weight_scale_2.to(torch.float32))
    scale[scale == 0] = 1.0
    return scale.clamp(min=FP8_MIN_SCALE, max=E4M3_MAX).to(torch.float8_e4m3fn)


def quantize(
    weight: torch.Tensor, weight_scale_2: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Quantize [out, in] to (packed uint8, fp8 block scales, fp32 scale_2); byte-identical to ModelOpt.

    Pass `weight_scale_2` to share one global scale across fused siblings (q/k/v, gate/up).
    """
    rows, cols = weight.shape
    if cols % BLOCK:
        raise ValueError(f"input dim {cols} is not a multiple of {BLOCK}")
    if weight.dtype not in _BITS or sys.byteorder != "little":
        return _quantize_direct(weight, weight_scale_2)
    packed = torch.empty((rows, cols // 2), dtype=torch.uint8)
    with _one_thread():
        amax = _block_amax(weight)  # the global amax is their max: one pass over the weight, not two
        scale_2 = amax.amax().float() / (E2M1_MAX * E4M3_MAX) if weight_scale_2 is None else weight_scale_2.to(torch.float32).reshape(())
        scales = _scales_from_amax(amax, scale_2)
        divisors = (scales.to(torch.float32) * scale_2).unsqueeze(-1)
        step = min(rows, max(1, CHUNK_ELEMENTS // max(cols, 1)))
        scaled_buf = torch.empty((step, cols // BLOCK, BLOCK), dtype=torch.float32)
        key_buf, below_buf = torch.empty(step * cols, dtype=torch.int32), torch.empty(step * cols, dtype=torch.int32)
        codes_buf, pairs_buf = torch.empty(step * cols, dtype=torch.uint8), torch.empty(step * cols // 2, dtype=torch.int16)
        for lo, hi in _row_chunks(rows, cols):
            n = (hi - lo) * cols
            scaled = scaled_buf[: hi - lo]
            scaled.copy_(weight[lo:hi].reshape(hi - lo, cols // BLOCK, BLOCK))
            scaled.div_(divisors[lo:hi])  # float32 division, as ModelOpt's `input / (scale * scale_2)`
            codes = _codes_by_table(scaled.view(-1).view(torch.int32), key_buf[:n], below_buf[:n], codes_buf[:n])
            pairs = codes.view(torch.int16)  # low byte = even element (little-endian)
            torch.bitwise_right_shift(pairs, 4, out=pairs_buf[: n // 2]).bitwise_or_(pairs)
            packed[lo:hi].view(-1).copy_(pairs_buf[: n // 2])  # int16 -> uint8 keeps the low byte: even | odd << 4
    return packed, scales, scale_2


def _class_of(bits: torch.Tensor, key: torch.Tensor, below: torch.Tensor) -> torch.Tensor:
    """(bits >> 21) + ((bits - 1) >> 21), masked to 12 bits: 2 * top-11-bits + (low 21 bits != 0), in
    two's complement; +0.0 and -0.0 land on 4095 or 2047 (both code 0, as ModelOpt treats -0 as 0)."""
    torch.bitwise_right_shift(bits, 21, out=key)
    torch.sub(bits, 1, out=below).bitwise_right_shift_(21)
    return key.add_(below).bitwise_and_(0xFFF)


def _codes_by_table(bits, key, below, codes):
    return torch.index_select(_CODE_TABLE, 0, _class_of(bits, key, below), out=codes)


def _code_table() -> torch.Tensor:
    """E2M1 code of every bit class, from one representative each through ModelOpt's rule (`_e2m1_codes`)."""
    top = torch.arange(2048, dtype=torch.int64) << 21
    patterns = torch.cat([top, top | 1])  # low bits zero, low bits not zero
    patterns = torch.where(patterns >= 2**31, patterns - 2**32, patterns).to(torch.int32)
    classes = _class_of(patterns, torch.empty_like(patterns), torch.empty_like(patterns)).long()
    codes = _e2m1_codes(patterns.view(torch.float32))
    table = torch.zeros(4096, dtype=torch.uint8)
    table[classes] = codes
    if not torch.equal(table[classes], codes):
        raise AssertionError("two bit patterns of one class have different E2M1 codes")
    table[2047] = table[4095]  # -0.0 if `bits - 1` does not wrap: the same code as +0.0
    return table


def _quantize_direct(weight, weight_scale_2):
    """The searchsorted form, for input dtypes other than bf16/fp16/fp32 (ModelOpt then computes in their precision)."""
    rows, cols = weight.shape
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


_CODE_TABLE = _code_table()


def canonical_codes(packed: torch.Tensor) -> torch.Tensor:
    """Map the -0 code (8) to +0 in both nibbles, so byte comparisons ignore the sign of zero.

    ModelOpt writes -0 for small negatives but dequantizes it to +0, so a dequantize/requantize
    round trip is only byte-identical after this normalisation.
    """
    low, high = packed & 0xF, packed >> 4
    low = torch.where(low == 8, 0, low)
    high = torch.where(high == 8, 0, high)
    return (high << 4) | low
