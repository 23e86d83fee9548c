"""Writing safetensors files: the header computed first, then each tensor's bytes streamed in order.

No file is ever held in memory, and untouched tensors are copied as raw bytes, never decoded. Reading and validating headers is repair.io.safetensors.
"""

from __future__ import annotations

import json
import struct
from itertools import accumulate
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Union

from repair.errors import BadInput, InternalError
from repair.io.dtypes import nbytes
from repair.io.hasher import Hasher
from repair.io.hashing import HashedOutput, SourceDigest
from repair.io.pins import PinnedFile
from repair.io.safetensors import TensorInfo

WRITER = "the shard writer's check of the planned header"


@dataclass(frozen=True)
class OutTensor:
    """A tensor to be written: its header entry. Bytes come later, in this order."""

    name: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return nbytes(self.dtype, self.shape)


def encode_header(tensors: Iterable[OutTensor], metadata: dict[str, str] | None) -> bytes:
    """The length prefix and JSON header for tensors laid out back to back in the given order.

    Deterministic: `__metadata__` first, then tensors in data order, compact JSON, padded with
    spaces to a multiple of 8 bytes as the safetensors library does.
    """
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


Bytes = Union[bytes, bytearray, memoryview]


class ShardWriter:
    """Write one safetensors file: header first, then each tensor's bytes streamed in order.

    Every byte written is hashed from the buffer it was written from (io/hashing.HashedOutput): a
    copied tensor is read once, through the input's pinned handle. `source`, when given, is the input
    shard this one replaces: its sha256 is computed from the same reads (`source_digest` after exit). `hasher`: a
    hashing thread shared with other writers (`fix --tp`: one per core, not one per rank), which its owner stops.
    """

    def __init__(self, path: Path, tensors: list[OutTensor], metadata: dict[str, str] | None, source: PinnedFile | None = None,
                 hasher: Hasher | None = None):
        self.path = Path(path)
        self._pending = list(reversed(tensors))
        header = encode_header(tensors, metadata)
        starts = accumulate((t.nbytes for t in tensors), initial=len(header))
        self._places = {t.name: (at, t.nbytes) for t, at in zip(tensors, starts)}  # name -> (offset in the file, bytes)
        self._placed: dict[str, object] = {}  # name -> the bytes `place` wrote there
        self._parts: dict[str, int] = {}  # name -> bytes `place_part` wrote of it so far
        self._out = HashedOutput(self.path, hasher)
        self.digest = self._out.digest
        self._source: SourceDigest | None = None
        self.source_digest: str | None = None
        try:  # until `with` holds it, nobody else closes the file or stops its hashing (Ctrl-C here left both)
            self._source = SourceDigest(source) if source is not None else None
            self._out.write(header)
        except BaseException:
            self._abort()
            raise

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self._abort()
            return
        try:
            if self._source is not None:
                self.source_digest = self._source.hexdigest()
            self._out.close()
        except BaseException:  # Ctrl-C as the hashing is waited for: the file is closed and its thread stopped all the same
            self._abort()
            raise
        if self._pending:
            raise InternalError(WRITER, f"{self.path}: tensors never written: {[t.name for t in self._pending]}")

    def _abort(self) -> None:
        """The source's thread reads the output back: it stops before the output closes."""
        if self._source is not None:
            self._source.abort()
        self._out.abort()

    def _next(self, name: str) -> OutTensor:
        expected = self._pending.pop() if self._pending else None
        if expected is None or expected.name != name:
            raise InternalError(WRITER, f"{self.path}: wrote {name} but the header expects {expected and expected.name}")
        return expected

    def write(self, name: str, data: Bytes) -> None:
        """Write a tensor's bytes (or account for the ones `place` wrote: the same object); the length must match
        its header entry. `data` must not change afterwards."""
        expected = self._next(name)
        view = memoryview(data).cast("B")
        if view.nbytes != expected.nbytes:
            raise InternalError(WRITER, f"{self.path}: {name}: {view.nbytes} bytes, header says {expected.nbytes}")
        self._out.write(view, placed=self._placed.pop(name, None) is data)

    def place(self, name: str, data: Bytes) -> None:
        """Write a computed tensor's bytes at its offset now, from any thread, before `write(name, data)` takes its
        turn in order and hashes them: `--jobs` workers copy their results into the page cache in parallel."""
        (at, size), view = self._places.get(name, (None, None)), memoryview(data).cast("B")
        if view.nbytes != size:
            raise InternalError(WRITER, f"{self.path}: {name}: {view.nbytes} bytes placed, header says {size}")
        self._out.place(view, at)
        self._placed[name] = data

    def place_part(self, name: str, offset: int, data: Bytes) -> None:
        """Write part of a computed tensor at `offset` inside it now, from any thread (3-D experts: one expert's bytes,
        made one at a time, in order); `written_in_place(name)` hashes the tensor in turn once every byte of it is placed."""
        (at, size), view = self._places.get(name, (None, 0)), memoryview(data).cast("B")
        done = self._parts.get(name, 0)  # parts come in order, each where the last ended: their sum proves coverage
        if at is None or offset != done or offset + view.nbytes > size:
            raise InternalError(WRITER, f"{self.path}: {name}: {view.nbytes} bytes placed at {offset} after {done}, "
                                f"header says {size}")
        self._out.place(view, at + offset)
        self._parts[name] = done + view.nbytes  # one thread places a tensor's parts

    def written_in_place(self, name: str) -> None:
        """Account for a tensor `place_part` wrote, in the header's order: hashed as it now is in the file."""
        expected = self._next(name)
        if self._parts.pop(name, 0) != expected.nbytes:
            raise InternalError(WRITER, f"{self.path}: {name}: placed parts do not cover its {expected.nbytes} bytes")
        self._out.placed(expected.nbytes)

    def copy(self, name: str, src: PinnedFile, info: TensorInfo, source: SourceDigest | None = None) -> None:
        """Copy a tensor's stored bytes from the input's handle without decoding them; `source`: the input's digest
        these bytes feed, when another writer owns it (`fix --tp`'s ranks share one per input shard)."""
        expected = self._next(name)
        if info.nbytes != expected.nbytes:
            raise InternalError(WRITER, f"{self.path}: {name}: source has {info.nbytes} bytes, header says {expected.nbytes}")
        try:
            self._out.copy(src, info.start, info.nbytes, source or self._source)
        except EOFError:
            raise BadInput(f"{src.path}: {name}: file ended while copying; it is truncated, re-download it") from None
