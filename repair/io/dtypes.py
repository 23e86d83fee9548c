"""Safetensors dtype names and their sizes, without importing torch.

Header-only commands (inspect, doctor) must stay torch-free, so dtype facts live here as plain data.
"""

from __future__ import annotations

ITEMSIZE: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,  # float8_e8m0fnu: DeepSeek-V4's ue8m0 block scales (a power of two per byte)
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}

FLOAT_DTYPES = frozenset({"F8_E4M3", "F8_E5M2", "F16", "BF16", "F32", "F64"})


def nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Byte length of a dense tensor of this dtype and shape."""
    count = 1
    for dim in shape:
        count *= dim
    return count * ITEMSIZE[dtype]
