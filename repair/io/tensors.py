"""Convert between stored tensor bytes and torch tensors (imported only by the executor)."""

from __future__ import annotations

import torch

from repair.io.safetensors import TensorInfo

TORCH_DTYPE: dict[str, torch.dtype] = {
    "BOOL": torch.bool,
    "U8": torch.uint8,
    "I8": torch.int8,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I16": torch.int16,
    "U16": torch.uint16,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
    "U32": torch.uint32,
    "F32": torch.float32,
    "I64": torch.int64,
    "U64": torch.uint64,
    "F64": torch.float64,
}
SAFETENSORS_DTYPE: dict[torch.dtype, str] = {v: k for k, v in TORCH_DTYPE.items()}


def from_bytes(data: bytes | bytearray, info: TensorInfo) -> torch.Tensor:
    """A tensor viewing `data` (little-endian, as safetensors stores it) with the info's dtype and shape."""
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    flat = torch.frombuffer(buffer, dtype=torch.uint8) if buffer else torch.empty(0, dtype=torch.uint8)
    return flat.view(TORCH_DTYPE[info.dtype]).reshape(info.shape)


def to_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's bytes in safetensors order (contiguous, little-endian), without a copy when possible."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    return memoryview(flat.numpy())
