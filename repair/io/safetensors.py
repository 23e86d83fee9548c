"""Safetensors headers, read and validated without reading any tensor bytes (no torch needed).

The format is an 8-byte little-endian header length, a JSON header, then the tensor bytes.
Every defect of a header (bad JSON, duplicate names, overlapping or missing byte ranges) is a
one-line BadInput here, before anything is planned. Tensors are read by byte range
(repair.io.ranges) and files are written by repair.io.shard_writer.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from repair.errors import BadInput, short
from repair.io.dtypes import ITEMSIZE, nbytes
from repair.io.parse import parse_json
from repair.io.names import file_type_problem
from repair.io.pins import PinnedFile

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's own limit
MAX_NDIM = 64  # far above any real tensor; bounds the work of multiplying a hostile shape out
MAX_DIM = 2**63  # torch and numpy index with int64: a larger dimension (even in an empty tensor) cannot be loaded


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as stored: its name, dtype, shape and absolute byte range in its file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int  # absolute offset in the file
    end: int
    path: Path | None = field(default=None, compare=False, repr=False)  # the file it is stored in

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class ShardHeader:
    """A parsed, validated safetensors header; tensors are in stored (byte-offset) order."""

    path: Path
    header_len: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] | None = field(default=None, compare=False)
    file: PinnedFile | None = field(default=None, compare=False, repr=False)  # the handle opened at plan time (io/pins.py)

    @property
    def data_start(self) -> int:
        return 8 + self.header_len

    @property
    def size(self) -> int:
        return self.data_start + sum(t.nbytes for t in self.tensors)

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


def read_header(path: Path, pinned: PinnedFile | None = None) -> ShardHeader:
    """Parse and validate a safetensors header, reading only the header bytes (through `pinned` when given)."""
    path = Path(path)
    if pinned is not None:
        header = _header_of(path, pinned.size, pinned.read_into)
        return ShardHeader(header.path, header.header_len, header.tensors, header.metadata, pinned)
    why = file_type_problem(path)  # stat before open: opening a FIFO would block forever
    if why and why != "is missing":
        raise BadInput(f"{path}: {why}; give a safetensors file")
    try:
        with open(path, "rb") as fh:
            return _header_of(path, os.fstat(fh.fileno()).st_size, lambda at, view: fh.readinto(view))
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror}); check the path and permissions") from None


def _header_of(path: Path, file_size: int, read_into) -> ShardHeader:
    prefix = bytearray(8)
    if file_size < 8:
        raise BadInput(f"{path}: file is {file_size} bytes, too short to be safetensors; re-download it")
    _read(read_into, 0, prefix, path)
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > MAX_HEADER_BYTES:
        raise BadInput(
            f"{path}: header length {header_len} is over the {MAX_HEADER_BYTES}-byte limit; "
            "the file is corrupt or not safetensors, re-download it"
        )
    if 8 + header_len > file_size:
        raise BadInput(
            f"{path}: header length {header_len} runs past the end of the {file_size}-byte file; "
            "the file is truncated or not safetensors, re-download it"
        )
    raw = bytearray(header_len)
    _read(read_into, 8, raw, path)
    return parse_header(path, bytes(raw), file_size)


def _read(read_into, offset: int, buffer: bytearray, path: Path) -> None:
    """Exactly len(buffer) bytes at `offset` (sequential readers ignore the offset: they read in order)."""
    view, done = memoryview(buffer), 0
    try:
        while done < len(buffer):
            got = read_into(offset + done, view[done:])
            if not got:
                raise EOFError
            done += got
    except EOFError:
        raise BadInput(f"{path}: file ended inside its header; it is truncated, re-download it") from None


def parse_header(path: Path, raw: bytes, file_size: int) -> ShardHeader:
    """Validate header JSON bytes against the file size; raise BadInput naming the defect."""
    where, fix = f"{path}: header is not valid JSON", "the file is corrupt, re-download it"
    header = parse_json(raw, where, fix)
    if not _every_key_kept(raw, header):
        try:
            header = parse_json(raw, where, fix, object_pairs_hook=_unique_keys)
        except _DuplicateKey as dup:
            raise BadInput(f"{path}: {dup.key}: name appears twice in the header; the file is corrupt, re-download it") from None
    if not isinstance(header, dict):
        raise BadInput(f"{path}: header is not a JSON object; the file is corrupt, re-download it")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())
    ):
        raise BadInput(f"{path}: __metadata__ must map strings to strings; the file is corrupt, re-download it")
    _check_unicode(path, header, metadata)
    data_start = 8 + len(raw)
    tensors = sorted((_tensor_info(path, name, entry, data_start) for name, entry in header.items()), key=_offset_key)
    _check_coverage(path, tensors, data_start, file_size - data_start)
    return ShardHeader(path=path, header_len=len(raw), tensors=tuple(tensors), metadata=metadata)


def _check_unicode(path: Path, header: dict, metadata: dict | None) -> None:
    """JSON's \\u escapes can spell lone surrogates, which no UTF-8 file (the output's header, a
    report, the terminal) can hold: refused here, naming the string, before anything is written."""
    for name in header:
        if not _utf8(name):
            raise BadInput(f"{path}: {name}: tensor name is not valid Unicode (a lone surrogate); the file is corrupt, re-download it")
    for key, value in (metadata or {}).items():
        if not (_utf8(key) and _utf8(value)):
            raise BadInput(f"{path}: __metadata__ is not valid Unicode (a lone surrogate in {key}); the file is corrupt, re-download it")


def _utf8(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _every_key_kept(raw: bytes, header: object) -> bool:
    """True when json.loads (which keeps the last of duplicate keys, silently) dropped no key: the parsed
    keys (two levels) number the raw text's `":` key ends. Without an escaped quote in the text, `":`
    only ends a key; any doubt (spaced or nested keys, escapes) answers False and the header is parsed
    again key by key. Saves a Python call per object on the common compact header."""
    if not isinstance(header, dict) or b'\\"' in raw:
        return False
    keys = len(header) + sum(len(v) for v in header.values() if type(v) is dict)
    return raw.count(b'":') == keys


class _DuplicateKey(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads keeps the last of duplicate keys silently; a header with one is corrupt.
    (Called for every object in the header, so the common case stays one C-level dict build.)"""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set = set()
        raise _DuplicateKey(next(key for key, _ in pairs if key in seen or seen.add(key)))
    return out


def _offset_key(info: TensorInfo) -> tuple[int, int]:
    return (info.start, info.end)


def _tensor_info(path: Path, name: str, entry: object, data_start: int) -> TensorInfo:
    """One header entry, validated. The common case (a well-formed entry) takes the first path: a
    DeepSeek-sized checkpoint has 180k of them; any doubt falls through to `_checked_info`'s errors."""
    if type(entry) is dict:
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        itemsize = ITEMSIZE.get(dtype) if type(dtype) is str else None
        if itemsize and type(shape) is list and len(shape) <= MAX_NDIM and type(offsets) is list and len(offsets) == 2:
            count, (begin, end) = itemsize, offsets
            for dim in shape:
                if type(dim) is not int or not 0 <= dim < MAX_DIM:
                    break
                count *= dim
            else:
                if type(begin) is int and type(end) is int and 0 <= begin and end - begin == count:
                    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end, path)
    return _checked_info(path, name, entry, data_start)


def _checked_info(path: Path, name: str, entry: object, data_start: int) -> TensorInfo:
    """The entry checked step by step, so the error names what is wrong."""
    if not isinstance(entry, dict):
        raise BadInput(f"{path}: {name}: header entry is not an object; the file is corrupt, re-download it")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise BadInput(f"{path}: {name}: unknown dtype {dtype!r}; this tool reads {', '.join(sorted(ITEMSIZE))}")
    if not (type(shape) is list and len(shape) <= MAX_NDIM and all(type(d) is int and 0 <= d < MAX_DIM for d in shape)):
        raise BadInput(f"{path}: {name}: shape {short(shape)} is not a list of at most 64 integers in [0, 2**63); the file is corrupt, re-download it")
    if not (
        isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise BadInput(f"{path}: {name}: data_offsets {short(offsets)} are not [begin, end]; the file is corrupt, re-download it")
    expected = nbytes(dtype, tuple(shape))
    if offsets[1] - offsets[0] != expected:
        raise BadInput(
            f"{path}: {name}: {dtype} {short(shape)} needs {expected} bytes but data_offsets span "
            f"{offsets[1] - offsets[0]}; the file is corrupt, re-download it"
        )
    return TensorInfo(name, dtype, tuple(shape), data_start + offsets[0], data_start + offsets[1], path)


def _check_coverage(path: Path, tensors: list[TensorInfo], data_start: int, data_len: int) -> None:
    """Tensors must tile the data section exactly: no gap, no overlap, nothing past the end."""
    if data_len < 0:
        raise BadInput(f"{path}: file ends inside its header; it is truncated, re-download it")
    for info in tensors:  # first, so a truncated file says so rather than naming a gap
        if info.end - data_start > data_len:
            raise BadInput(
                f"{path}: {info.name}: data_offsets [{info.start - data_start}, {info.end - data_start}] run past the "
                f"{data_len}-byte data section; the file is truncated or corrupt, re-download it"
            )
    expected = data_start
    for info in tensors:
        if info.start != expected:
            kind = "overlaps the previous tensor" if info.start < expected else "leaves a gap before it"
            raise BadInput(f"{path}: {info.name}: data range {kind}; the file is corrupt, re-download it")
        expected = info.end
    used = expected - data_start
    if used < data_len:
        raise BadInput(f"{path}: {data_len - used} bytes after the last tensor; the file is corrupt, re-download it")
