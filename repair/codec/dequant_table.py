"""NVFP4 dequantize as one table lookup per output pair, on numpy: no torch import needed.

`fix --target bf16` dequantizes every linear and nothing else, so with this path it never pays
torch's ~1-1.5 s import (BENCHMARKS.md). The torch API (`nvfp4.dequantize`) calls the same code,
so there is one implementation, checked bitwise against ModelOpt in tests/test_codec_nvfp4.py.

A block scale is one of 256 FP8 bit patterns and a packed byte one of 256 nibble pairs, so each
output pair is `table[scale byte << 8 | packed byte]`. The entries are float32 products in
ModelOpt's order, `E2M1 * (float(scale) * scale_2)`, rounded once to the output dtype; NaN
becomes 0xFFFF in bf16, as torch's CPU conversion writes it.
"""

from __future__ import annotations

import mmap
from typing import Iterator, Sequence

import numpy as np

BLOCK = 16
CHUNK_ELEMENTS = 1 << 18  # logical elements per chunk: each temporary stays within L2 (<= 1 MiB)
OUT_DTYPES = ("BF16", "F16", "F32")  # safetensors names this path writes

_E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, 0, -0.5, -1, -1.5, -2, -3, -4, -6], dtype=np.float32)
_BYTES = np.arange(256)
_PAIR = np.stack([_E2M1[_BYTES & 0xF], _E2M1[_BYTES >> 4]], axis=-1)  # byte -> (low, high nibble value)
# compressed-tensors' unpack keeps the sign of code 8 (-0.0), where ModelOpt gives +0.
_SIGNED_PAIR = np.where(np.stack([_BYTES & 0xF, _BYTES >> 4], axis=-1) == 8, np.float32(-0.0), _PAIR)


def _fp8_e4m3fn_values() -> np.ndarray:
    """float32 value of every E4M3FN bit pattern (bias 7, subnormals, no inf); all exact.

    0x7F/0xFF are NaN with torch's bits (0x7FF00000 / 0xFFF00000): NaN products keep them, so the
    float32 output of a NaN block matches ModelOpt's bit for bit.
    """
    sign = np.where(_BYTES >> 7, -1.0, 1.0)
    exponent, mantissa = (_BYTES >> 3) & 0xF, _BYTES & 0x7
    magnitude = np.where(exponent == 0, mantissa / 8 * 2.0**-6, (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    values = (sign * magnitude).astype(np.float32)
    values.view(np.uint32)[[0x7F, 0xFF]] = (0x7FF00000, 0xFFF00000)
    return values


FP8_E4M3FN = _fp8_e4m3fn_values()


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16): round to nearest even, NaN -> 0xFFFF (torch on CPU)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0xFFFF), rounded)


def pair_table(scale_2: float, out_dtype: str, divisor: bool = False) -> np.ndarray:
    """[scale byte * 256 + packed byte] -> that output pair's bits, one uint32 (2-byte dtypes) or uint64 word.

    divisor=True: compressed-tensors, whose weight_global_scale divides (1 / ModelOpt's weight_scale_2).
    """
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"dequantize writes {', '.join(OUT_DTYPES)}, not {out_dtype}")
    global_scale = np.float32(scale_2)
    with np.errstate(all="ignore"):  # inf/NaN scales are data here, as in ModelOpt
        per_block = FP8_E4M3FN / global_scale if divisor else FP8_E4M3FN * global_scale
        products = (_SIGNED_PAIR if divisor else _PAIR)[np.newaxis] * per_block.reshape(256, 1, 1)  # float32, ModelOpt's order
        rounded = {"BF16": to_bf16_bits, "F16": lambda v: v.astype(np.float16), "F32": lambda v: v}[out_dtype](products)
    return rounded.reshape(-1).view(np.uint64 if out_dtype == "F32" else np.uint32)


_EXPONENT_MASK = {"BF16": 0x7F80, "F16": 0x7C00, "F32": 0x7F800000}  # all exponent bits set: an infinity or a NaN


def non_finite(bits: np.ndarray, out_dtype: str) -> np.ndarray:
    """Where the `out_dtype` bit patterns are a NaN or an infinity (bool, same shape)."""
    mask = _EXPONENT_MASK[out_dtype]
    return (bits & mask) == mask


def non_finite_blocks(scale_bytes: np.ndarray, scale_2: float, out_dtype: str, divisor: bool = False) -> int:
    """How many blocks would dequantize to a NaN or an infinity: those whose scale code's row of the table
    holds one. Reads the block scales only (1/16 of the output), so guarding every output costs little."""
    return int(np.count_nonzero(non_finite_codes(scale_2, out_dtype, divisor)[scale_bytes]))


def non_finite_codes(scale_2: float, out_dtype: str, divisor: bool = False) -> np.ndarray:
    """bool [256]: the block-scale codes whose row of the table holds a NaN or an infinity (a caller reading the scales
    part by part counts their blocks itself)."""
    words = pair_table(scale_2, out_dtype, divisor).reshape(256, -1)
    values = words.view(np.uint32 if out_dtype == "F32" else np.uint16)
    mask = _EXPONENT_MASK[out_dtype]
    return ((values & mask) == mask).any(axis=1)


def dequantize(packed: np.ndarray, scale_bytes: np.ndarray, scale_2: float, out_dtype: str, divisor: bool = False) -> np.ndarray:
    """packed uint8 [rows, in/2] + FP8 scale bytes uint8 [rows, in/16] -> output bits [rows, in] (uint16/uint32).

    Row chunks sized for the L2 cache; one thread (numpy's take does not spread over cores).
    """
    rows, half = packed.shape
    cols, blocks, pairs = half * 2, half * 2 // BLOCK, BLOCK // 2
    if scale_bytes.shape != (rows, blocks):
        raise ValueError(f"block scales {scale_bytes.shape} do not fit a packed weight {packed.shape}")
    table = pair_table(scale_2, out_dtype, divisor)
    out = _fresh_pages((rows, half), table.dtype)  # one word per output pair
    step = max(1, CHUNK_ELEMENTS // max(cols, 1))
    index = np.empty((min(step, rows), blocks, pairs), dtype=np.intp)
    for lo in range(0, rows, step):
        hi = min(rows, lo + step)
        ix = index[: hi - lo]
        np.left_shift(scale_bytes[lo:hi, :, np.newaxis], 8, out=ix, dtype=np.intp)
        np.add(ix, packed[lo:hi].reshape(hi - lo, blocks, pairs), out=ix)
        np.take(table, ix.reshape(-1), out=out[lo:hi].reshape(-1), mode="clip")  # indices < 65536 by construction
    return out.view(np.uint16 if out_dtype != "F32" else np.uint32).reshape(rows, cols)


def dequantize_experts(packed: Sequence[np.ndarray], scale_bytes: np.ndarray, scale_2: float, out_dtype: str,
                       divisor: bool = False) -> np.ndarray:
    """ModelOpt's transposed BMM experts (gpt-oss, Llama4): packed uint8 [E, in/2, out] + FP8 scale bytes [E, in/16, out]
    -> output bits [E, in, out], one expert after another into one output; each expert is its [out, in] Linear
    transposed (formats/nvfp4_packed.py `_bmm_experts`). `packed[e]` is asked once per expert, in order, so a reader
    of one expert at a time may stand for the array (execute/compute.py: memory then holds one expert's bytes).

    Element (e, i, o) is nibble i % 2 of packed[e, i // 2, o] scaled by scale[e, i // 16, o]: the 2-D path's table
    entry for that Linear, written in place without transposing anything. Beside the output, memory holds one chunk's
    indices and pairs (~1.5 MiB), not float32 products.
    """
    experts, blocks, cols = scale_bytes.shape
    if len(packed) != experts:
        raise ValueError(f"block scales {scale_bytes.shape} do not fit {len(packed)} packed experts")
    word = np.uint16 if out_dtype != "F32" else np.uint32
    out = _fresh_pages((experts, blocks, BLOCK // 2, 2, cols), word)  # [E, in, out]: input row 16b + 2p + nibble
    _Expert(pair_table(scale_2, out_dtype, divisor), blocks, cols).each(packed, scale_bytes, lambda e: out[e])
    return out.reshape(experts, blocks * BLOCK, cols)


def each_expert(packed: Sequence[np.ndarray], scale_bytes: Sequence[np.ndarray], scale_2: float, out_dtype: str,
                divisor: bool = False) -> Iterator[np.ndarray]:
    """`dequantize_experts` one expert at a time: expert e's output bits [in, out], each a new array, with both inputs
    asked per expert (`scale_bytes[e]` [in/16, out]): readers of one expert may stand for both, so memory holds one
    expert (`fix --tp` writes each rank's part of it where it goes; `--original` compares it). The same entries in
    the same places: the bytes `dequantize_experts` writes, expert by expert."""
    if len(scale_bytes) != len(packed):
        raise ValueError(f"{len(scale_bytes)} experts' block scales do not fit {len(packed)} packed experts")
    word = np.uint16 if out_dtype != "F32" else np.uint32
    table, expert = pair_table(scale_2, out_dtype, divisor), None
    for e in range(len(packed)):
        scale = scale_bytes[e]
        expert = expert or _Expert(table, *scale.shape)
        out = _fresh_pages((scale.shape[0], BLOCK // 2, 2, scale.shape[1]), word)
        expert.one(e, packed[e], scale, out)
        yield out.reshape(scale.shape[0] * BLOCK, scale.shape[1])


class _Expert:
    """One expert's dequantization through a pair table, chunk by chunk: its index and result buffers, reused."""

    def __init__(self, table: np.ndarray, blocks: int, cols: int):
        self.table, self.shape = table, (blocks, cols)
        self.step = max(1, CHUNK_ELEMENTS // (BLOCK * max(cols, 1)))  # block rows per chunk
        self.index = np.empty((min(self.step, blocks), BLOCK // 2, cols), dtype=np.intp)
        self.made = np.empty(self.index.shape, dtype=table.dtype)

    def each(self, packed: Sequence[np.ndarray], scale_bytes: np.ndarray, into) -> None:
        for e in range(scale_bytes.shape[0]):
            self.one(e, packed[e], scale_bytes[e], into(e))

    def one(self, e: int, expert: np.ndarray, scale: np.ndarray, out: np.ndarray) -> None:
        """Expert e's bits into `out` [in/16, 8, 2, out]; its packed bytes [in/2, out], its block scales [in/16, out]."""
        (blocks, cols), pairs = self.shape, BLOCK // 2
        if expert.shape != (blocks * pairs, cols) or scale.shape != self.shape:
            raise ValueError(f"block scales {scale.shape} do not fit packed expert {e} {expert.shape}")
        word = out.dtype
        for lo in range(0, blocks, self.step):
            hi = min(blocks, lo + self.step)
            ix, got = self.index[: hi - lo], self.made[: hi - lo]
            np.left_shift(scale[lo:hi, np.newaxis, :], 8, out=ix, dtype=np.intp)
            np.add(ix, expert[lo * pairs:hi * pairs].reshape(hi - lo, pairs, cols), out=ix)
            np.take(self.table, ix.reshape(-1), out=got.reshape(-1), mode="clip")  # indices < 65536 by construction
            out[lo:hi] = got.view(word).reshape(hi - lo, pairs, cols, 2).transpose(0, 1, 3, 2)  # low nibble: even row


def _fresh_pages(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised array on anonymous pages, without numpy's MADV_HUGEPAGE advice.

    np.empty advises huge pages for large arrays; where the kernel defragments on that advice
    (THP defrag "madvise", as here), first touch stalls on compaction: dequantizing [8192, 8192]
    took 0.46 s instead of 0.13 s (BENCHMARKS.md). mmap pages are plain 4 KiB ones.
    """
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    pages = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # private: a shared one is shmem, slower to fault in
    return np.frombuffer(pages, dtype=dtype, count=int(np.prod(shape))).reshape(shape)
