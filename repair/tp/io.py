"""Byte-range I/O shared by `fix --tp` and `unshard`: atomic output folders, exact preads, tensor slices.

A slice along a tensor's first non-trivial dim is one byte range (streamed, never buffered); any
other slice is one read per outer row into a buffer the size of the slice, never of the tensor.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from typing import Callable, TypeVar

from repair.errors import BadInput, OutputError
from repair.execute.writer import check_output
from repair.io.dtypes import ITEMSIZE, nbytes
from repair.io.hashing import sha256_file
from repair.io.safetensors import TensorInfo
from repair.io.output import publish, staged
from repair.io.staging import apply_modes, fsync_tree

T = TypeVar("T")


def write_json(path: Path, content: dict) -> str:
    """The same bytes execute writes for a small JSON file (2-space indent, trailing newline); returns sha256."""
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return sha256_file(path)


def build_atomically(src: Path, out: Path, overwrite: bool, build: Callable[[Path], T], original: Path | None = None) -> T:
    """Run `build(tmp)` in a temp folder beside OUT and publish it by one rename (as execute does)."""
    check_output(src, out, overwrite, original)
    try:
        with staged(out) as (tmp, state):
            value = build(tmp)
            apply_modes(tmp, src)
            fsync_tree(tmp)
            publish(tmp, out, state, overwrite)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
            raise OutputError(f"{out}: disk full while writing; nothing was written, free space on {out.parent} or choose another -o") from None
        raise OutputError(f"{exc.filename or out}: {exc.strerror or exc}; nothing was written, check the disk and permissions") from None
    except EOFError:
        raise BadInput(f"{src}: a file got shorter while it was read; make sure nothing writes to it, then re-run") from None
    return value


def pread_exact(fd: int, offset: int, view: memoryview, where: str) -> None:
    done = 0
    while done < view.nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise BadInput(f"{where}: file ended while reading; it is truncated, re-download it")
        done += got


def read_slice(path: Path, info: TensorInfo, dim: int, start: int, end: int) -> bytearray:
    """Elements [start, end) of `dim`: one read when the slice is contiguous, else one read per outer row."""
    shape = info.shape
    outer = prod(shape[:dim])
    inner = prod(shape[dim + 1:]) * ITEMSIZE[info.dtype]
    width, row = (end - start) * inner, shape[dim] * inner
    out = bytearray(outer * width)
    view = memoryview(out)
    with open(path, "rb") as fh:
        if outer == 1 or width == row:
            pread_exact(fh.fileno(), info.start + start * inner, view, f"{path}: {info.name}")
        else:
            for o in range(outer):
                pread_exact(fh.fileno(), info.start + o * row + start * inner, view[o * width:(o + 1) * width], f"{path}: {info.name}")
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
