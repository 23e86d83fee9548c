"""Byte-range I/O shared by `fix --tp` and `unshard`: exact preads and tensor slices.

A slice along a tensor's first non-trivial dim is one byte range (streamed, never buffered); any
other slice is one read per outer row into a buffer the size of the slice, never of the tensor.
"""

from __future__ import annotations

import os

from repair.errors import BadInput
from repair.io.dtypes import ITEMSIZE, nbytes
from repair.io.pins import PinnedFile
from repair.io.safetensors import TensorInfo


def pread_exact(fd: int, offset: int, view: memoryview, where: str) -> None:
    done = 0
    while done < view.nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise BadInput(f"{where}: file ended while reading; it is truncated, re-download it")
        done += got


def read_slice(src: PinnedFile, info: TensorInfo, dim: int, start: int, end: int) -> bytearray:
    """Elements [start, end) of `dim`, through the input's pinned handle: one read when the slice is
    contiguous, else one read per outer row."""
    shape = info.shape
    outer = prod(shape[:dim])
    inner = prod(shape[dim + 1:]) * ITEMSIZE[info.dtype]
    width, row = (end - start) * inner, shape[dim] * inner
    out = bytearray(outer * width)
    view = memoryview(out)
    where = f"{src.path}: {info.name}"
    if outer == 1 or width == row:
        pread_exact(src.fd, info.start + start * inner, view, where)
    else:
        for o in range(outer):
            pread_exact(src.fd, info.start + o * row + start * inner, view[o * width:(o + 1) * width], where)
    return out


def prod(dims) -> int:
    count = 1
    for d in dims:
        count *= d
    return count


def contiguous(shape: tuple[int, ...], dim: int) -> bool:
    """A slice along the first non-trivial dim is one byte range of the stored tensor."""
    return all(d == 1 for d in shape[:dim])


def sub_range(info: TensorInfo, dim: int, start: int, end: int) -> TensorInfo:
    """The stored info of elements [start, end) of `dim`, when that slice is contiguous."""
    inner = prod(info.shape[dim + 1:]) * ITEMSIZE[info.dtype]
    offset = info.start + start * inner
    shape = info.shape[:dim] + (end - start,) + info.shape[dim + 1:]
    return TensorInfo(info.name, info.dtype, shape, offset, offset + nbytes(info.dtype, shape), info.path)
