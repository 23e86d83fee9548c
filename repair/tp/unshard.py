"""`unshard`: rebuild the standard checkpoint from `fix --tp` output, byte for byte.

Reads tp_manifest.json, hostile data, through repair/tp/manifest.py (every name and value
checked first), and checks every rank file against its recorded sha256. Each
standard shard is then written with the manifest's header (canonical, or the source's own
verbatim) and every tensor is concatenated back from the ranks' slices, streaming: dim-0 splits
are copied rank after rank, other dims interleaved a few MiB of rows at a time, replicated
tensors copied from rank 0. Config and other small files come from rank-0, the index from the
manifest. Only repair_report.json differs from the non-TP `fix` output: it records this unshard.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from repair.errors import BadInput
from repair.io.atomic import build_atomically, check_files, check_header, write_json
from repair.io.dtypes import nbytes
from repair.io.hashing import HashedOutput, sha256_pinned
from repair.io.names import file_type_problem, regular_file
from repair.io.pins import PinnedFile, Pins
from repair.io.safetensors import TensorInfo, read_header
from repair.io.staging import InterruptGate
from repair.io.shard_writer import OutTensor, encode_header
from repair.execute.copies import WholeCopies
from repair.execute.report import REPORT_NAME, unshard_report
from repair.tp.io import pread_exact
from repair.tp.manifest import MANIFEST, RANK_FILE, Manifest, read_manifest

CHUNK = 8 << 20  # bytes of interleaved rows assembled at a time
CHECK = "the check of the rebuilt checkpoint"


@dataclass(frozen=True)
class UnshardResult:
    out: Path
    report: dict


def unshard(src: Path, out: Path, *, overwrite: bool = False) -> UnshardResult:
    """Reassemble `fix --tp` output at SRC into a standard checkpoint at OUT, atomically."""
    src, out = Path(src), Path(out)
    pins = Pins()  # the manifest and every rank file, opened once: every byte is read through these handles
    manifest = read_manifest(src, pins)
    ranks = _check_ranks(manifest, pins)
    return build_atomically(src, out, overwrite, lambda tmp, gate: _build(src, manifest, ranks, pins, tmp, out, gate))


def _check_ranks(manifest: Manifest, pins: Pins) -> list[dict[str, TensorInfo]]:
    """Every rank file a regular file with the sha256 the manifest records, pinned; returns each rank's tensor infos."""
    infos = []
    for rank in manifest.ranks:
        for path, digest in rank.files.values():
            if file_type_problem(path) == "is missing":
                raise BadInput(f"{path}: missing; the tp output is incomplete, re-run `fix --tp`")
            regular_file(path, "re-run `fix --tp`")  # stat first: hashing a FIFO would block forever
            if _sha256(pins.pin(path)) != digest:
                raise BadInput(f"{path}: sha256 differs from {MANIFEST}; the file was changed or damaged, re-run `fix --tp`")
        path = rank.files[RANK_FILE][0]
        infos.append(read_header(path, pins.get(path)).by_name())
    return infos


def _sha256(pinned: PinnedFile) -> str:
    try:
        return sha256_pinned(pinned)
    except EOFError:
        raise BadInput(f"{pinned.path}: file ended while reading; it was truncated, re-run `fix --tp`") from None


def _build(src: Path, manifest: Manifest, ranks: list[dict[str, TensorInfo]], pins: Pins, tmp: Path, out: Path,
           gate: InterruptGate) -> UnshardResult:
    hashes: dict[str, str] = {}
    files = [pins.get(r.files[RANK_FILE][0]) for r in manifest.ranks]
    small = {name: (pins.get(manifest.ranks[0].files[name][0]), _parent(tmp, name)) for name in manifest.files}
    with WholeCopies(small, finish=True) as copies:  # rank 0's small files, copied beside the shards (and off the main thread)
        for shard in manifest.shards:
            _parent(tmp, shard["name"])
            hashes[shard["name"]] = _write_shard(tmp / shard["name"], shard, manifest.tensors, ranks, pins, files, gate)
        for name in manifest.files:
            hashes[name] = copies.digest(name)
    if manifest.index:
        name, text = manifest.index
        hashes[name] = _hashed_file(_parent(tmp, name), gate, lambda index: index.write(text.encode("utf-8")))
    report = unshard_report(src, sha256_pinned(pins.get(manifest.path)), manifest.tp, manifest.source, hashes)
    write_json(tmp / REPORT_NAME, report)
    _self_check(tmp, out, manifest, set(hashes) | {REPORT_NAME})
    pins.check("SRC")  # last: a rank file or the manifest changed while it was read, and nothing is published
    return UnshardResult(out, report)


def _hashed_file(path: Path, gate: InterruptGate, fill: Callable[[HashedOutput], None]) -> str:
    """A new file written by `fill`; the sha256 of the bytes written. It opens with signals held until this frame owns
    it, and any error or interrupt closes it and stops its hashing thread before the temp folder goes."""
    written = None
    try:
        with gate.held():
            written = HashedOutput(path)
        fill(written)
        return written.close()
    except BaseException:
        if written is not None:
            written.abort()
        raise


def _parent(tmp: Path, name: str) -> Path:
    """tmp / name (a checked manifest name) with its folders created."""
    path = tmp.joinpath(*name.split("/"))
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _header(shard: dict, tensors: dict) -> bytes:
    if "header" in shard:
        raw = shard["header"].encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    return encode_header([OutTensor(n, tensors[n]["dtype"], tuple(tensors[n]["shape"])) for n in shard["tensors"]], shard["metadata"])


def _write_shard(path: Path, shard: dict, tensors: dict, ranks: list[dict[str, TensorInfo]], pins: Pins, files: list[PinnedFile],
                 gate: InterruptGate) -> str:
    """Stream one standard shard: header, then each tensor rebuilt from the ranks; returns the sha256 of
    the bytes written (hashed from the buffers they were written from)."""
    def fill(out: HashedOutput) -> None:
        out.write(_header(shard, tensors))
        for name in shard["tensors"]:
            entry = tensors[name]
            parts = [_rank_info(ranks[r], name, entry, r) for r in range(len(ranks))]
            before = out.written
            _concat(out, entry, parts, files)
            if out.written - before != nbytes(entry["dtype"], tuple(entry["shape"])):
                raise BadInput(f"{name}: the ranks' slices do not add up to {entry['shape']}; the manifest and rank files disagree")
    try:
        return _hashed_file(path, gate, fill)
    except EOFError:
        pins.check("SRC")  # names the file that got shorter
        raise BadInput(f"{path.name}: a rank file ended while it was read; it was truncated, re-run `fix --tp`") from None


def _rank_info(infos: dict[str, TensorInfo], name: str, entry: dict, rank: int) -> TensorInfo:
    info = infos.get(name)
    want = tuple(entry["ranks"][rank]["shape"])
    if info is None or info.shape != want or info.dtype != entry["dtype"]:
        found = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
        raise BadInput(f"rank {rank}: {name} is {found}, the manifest says {entry['dtype']} {list(want)}; re-run `fix --tp`")
    return info


def _concat(out: HashedOutput, entry: dict, parts: list[TensorInfo], files: list[PinnedFile]) -> None:
    """Write the full tensor: rank 0's copy when replicated, else the ranks' slices joined along `dim`."""
    dim = entry["dim"]
    if nbytes(entry["dtype"], tuple(entry["shape"])) == 0:
        return  # nothing to join (and an empty tensor's other dims may be huge: no loop over them)
    if dim is None:
        out.copy(files[0], parts[0].start, parts[0].nbytes)
        return
    shape = entry["shape"]
    outer = 1
    for d in shape[:dim]:
        outer *= d
    if outer == 1:
        for file, info in zip(files, parts):
            out.copy(file, info.start, info.nbytes)
        return
    widths = [info.nbytes // outer for info in parts]  # each rank's bytes per outer row
    row = sum(widths)
    step = max(1, CHUNK // max(row, 1))
    for o0 in range(0, outer, step):
        k = min(step, outer - o0)
        buf = bytearray(k * row)
        col = 0
        for file, info, w in zip(files, parts, widths):
            part = bytearray(k * w)
            pread_exact(file.fd, info.start + o0 * w, memoryview(part), info.name)
            for i in range(k):
                buf[i * row + col: i * row + col + w] = part[i * w:(i + 1) * w]
            col += w
        out.write(buf)


def _self_check(tmp: Path, out: Path, manifest: Manifest, expected: set[str]) -> None:
    """Re-open every rebuilt shard and compare its header with the manifest before anything is published."""
    check_files(tmp, out, expected, CHECK, against="the manifest")
    tensors = manifest.tensors
    for shard in manifest.shards:
        want = [(n, tensors[n]["dtype"], tuple(tensors[n]["shape"])) for n in shard["tensors"]]
        check_header(tmp, out, shard["name"], want, check=CHECK, against="the manifest")


def unshard_text(result: UnshardResult) -> str:
    files = [o["name"] for o in result.report["outputs"]]
    return f"wrote {result.out}: the standard checkpoint rebuilt from {result.report['source']['tp']} rank(s) ({len(files)} files)"

