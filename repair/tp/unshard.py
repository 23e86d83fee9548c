"""`unshard`: rebuild the standard checkpoint from `fix --tp` output, byte for byte.

Reads tp_manifest.json, hostile data, through repair/tp/manifest.py (every name and value
checked first), and every rank file once: the bytes read to rebuild are the bytes hashed
(repair/tp/rank_digests.py), and a rank file whose sha256 is not the manifest's is refused at the
end, before anything is published. Each standard shard is then written with the manifest's header (canonical, or the source's own
verbatim) and every tensor is concatenated back from the ranks' slices, streaming: dim-0 splits
are copied rank after rank, other dims interleaved a few MiB of rows at a time, replicated
tensors copied from rank 0. Config and other small files come from rank-0, the index from the
manifest. Only repair_report.json differs from the non-TP `fix` output: it records this unshard.

Shards and their tensors are rebuilt in the order rank 0's file stores them, each written at its place in the output
(a tensor stored before the one the output appends next goes ahead: `_Ahead`), so a manifest listing them in another
order (hand-edited, still valid) still reads every rank file forward, once. Rank files storing different orders, or a
manifest that interleaves shards in a rank file, read a file again to hash it (correct, not read-once).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from itertools import accumulate
from pathlib import Path
from typing import Callable

import numpy as np

from repair.errors import BadInput
from repair.io.atomic import build_atomically, check_files, check_header, write_json
from repair.io.dtypes import nbytes
from repair.io.hashing import HashedOutput, SourceDigest, sha256_pinned
from repair.io.names import file_type_problem, regular_file
from repair.io.pins import PinnedFile, Pins
from repair.io.safetensors import TensorInfo
from repair.io.staging import InterruptGate
from repair.io.shard_writer import OutTensor, encode_header
from repair.execute.copies import WholeCopies
from repair.execute.report import REPORT_NAME, unshard_report
from repair.tp.manifest import MANIFEST, RANK_FILE, Manifest, read_manifest
from repair.tp.rank_digests import RankDigests, check_open_files, RankFile, largest_rank_file, read_rank, refuse_if_changed

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
    _check_slices(manifest, ranks)
    return build_atomically(src, out, overwrite, lambda tmp, gate: _build(src, manifest, ranks, pins, tmp, out, gate))


def _check_ranks(manifest: Manifest, pins: Pins) -> list[RankFile]:
    """Every rank file a regular file, pinned (nothing is read before all are: a FIFO or a missing file is refused
    first); then each rank's tensor file header, hashed as it is read."""
    check_open_files(sum(len(rank.files) for rank in manifest.ranks), manifest.tp, manifest.path.parent)
    for rank in manifest.ranks:
        for name, (path, _) in rank.files.items():
            if file_type_problem(path) == "is missing":
                raise BadInput(f"{path}: missing; the tp output is incomplete, re-run `fix --tp`")
            regular_file(path, "re-run `fix --tp`")  # stat first: opening a FIFO would block forever
            size = pins.pin(path).size
            if name in rank.sizes and size != rank.sizes[name]:  # refused by a stat: a sparse terabyte is never read
                raise BadInput(f"{path}: {size} bytes, {MANIFEST} records {rank.sizes[name]}; the file was changed or "
                               "damaged, re-run `fix --tp`")
    return [read_rank(path, pins.get(path), digest, lambda r=r: largest_rank_file(manifest, r))
            for r, (path, digest) in enumerate(rank.files[RANK_FILE] for rank in manifest.ranks)]


def _check_slices(manifest: Manifest, ranks: list[RankFile]) -> None:
    """Every tensor's slice on every rank is stored with the manifest's dtype and shape, before anything is written;
    a rank file that is not says so by its sha256 when that differs from the manifest's (read again: the failure path)."""
    for name, entry in manifest.tensors.items():
        for r, rank in enumerate(ranks):
            info, want = rank.tensors.get(name), tuple(entry["ranks"][r]["shape"])
            if info is None or info.shape != want or info.dtype != entry["dtype"]:
                refuse_if_changed(rank.file, manifest.ranks[r].files[RANK_FILE][1], lambda: largest_rank_file(manifest, r))
                found = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
                raise BadInput(f"rank {r}: {name} is {found}, the manifest says {entry['dtype']} {list(want)}; re-run `fix --tp`")


def _build(src: Path, manifest: Manifest, ranks: list[RankFile], pins: Pins, tmp: Path, out: Path,
           gate: InterruptGate) -> UnshardResult:
    hashes: dict[str, str] = {}
    small = {name: (pins.get(manifest.ranks[0].files[name][0]), _parent(tmp, name)) for name in manifest.files}
    with RankDigests(manifest, ranks, gate) as digests, WholeCopies(small, finish=True) as copies:  # rank 0's small files,
        hashes.update((shard["name"], "") for shard in manifest.shards)  # listed in the manifest's order
        first = lambda shard: min((ranks[0].tensors[n].start for n in shard["tensors"]), default=0)  # noqa: E731
        for shard in sorted(manifest.shards, key=first):  # copied beside the shards (and off the main thread); rank 0's order
            _parent(tmp, shard["name"])
            hashes[shard["name"]] = _write_shard(tmp / shard["name"], shard, manifest.tensors, ranks, digests, pins, gate)
        for name in manifest.files:
            hashes[name] = copies.digest(name)
        digests.check(pins, {name: hashes[name] for name in manifest.files})  # before anything else is written
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


def _write_shard(path: Path, shard: dict, tensors: dict, ranks: list[RankFile], digests: RankDigests, pins: Pins,
                 gate: InterruptGate) -> str:
    """Stream one standard shard: header, then each tensor rebuilt from the ranks; returns the sha256 of
    the bytes written (hashed from the buffers they were written from)."""
    def fill(out: HashedOutput) -> None:
        out.write(_header(shard, tensors))
        listed = shard["tensors"]
        sizes = {n: nbytes(tensors[n]["dtype"], tuple(tensors[n]["shape"])) for n in listed}
        starts = dict(zip(listed, accumulate((sizes[n] for n in listed), initial=out.written)))
        done, ahead, waiting = set(), set(), 0  # waiting: the first listed tensor the appending has not passed
        for name in sorted(listed, key=lambda n: ranks[0].tensors[n].start):  # rank 0's order: every rank file read forward
            entry = tensors[name]
            parts = [(rank.file, rank.tensors[name], digests.of(r)) for r, rank in enumerate(ranks)]  # checked by _check_slices
            target = out if starts[name] == out.written else _Ahead(out, starts[name])
            before = target.written
            _concat(target, entry, parts)
            if target.written - before != sizes[name]:
                raise BadInput(f"{name}: the ranks' slices do not add up to {entry['shape']}; the manifest and rank files disagree")
            done.add(name)
            ahead.update([name] if target is not out else [])
            while waiting < len(listed) and listed[waiting] in done:  # the appending reaches what was written ahead: hashed
                out.placed(sizes[listed[waiting]] if listed[waiting] in ahead else 0)
                waiting += 1
    try:
        return _hashed_file(path, gate, fill)
    except EOFError:
        pins.check("SRC")  # names the file that got shorter
        raise BadInput(f"{path.name}: a rank file ended while it was read; it was truncated, re-run `fix --tp`") from None


class _Ahead:
    """`_concat`'s output for a tensor the rank files store before the one the output appends next: written at its
    place, ahead of the appending (HashedOutput.copy_at, place), and hashed when the appending reaches it (`placed`)."""

    def __init__(self, out: HashedOutput, at: int):
        self.out, self.written = out, at

    def copy(self, src: PinnedFile, offset: int, length: int, source: SourceDigest | None = None) -> None:
        self.out.copy_at(src, offset, length, self.written, source)
        self.written += length

    def write(self, data) -> None:
        view = memoryview(data).cast("B")
        self.out.place(view, self.written)
        self.written += view.nbytes


Part = tuple[PinnedFile, TensorInfo, SourceDigest]  # one rank's slice of a tensor, and the digest its reads feed


def _concat(out: HashedOutput, entry: dict, parts: list[Part]) -> None:
    """Write the full tensor: rank 0's copy when replicated, else the ranks' slices joined along `dim`. Every byte
    read from a rank file feeds that file's digest (the copies' as written, the interleaved rows' as read)."""
    dim = entry["dim"]
    if nbytes(entry["dtype"], tuple(entry["shape"])) == 0:
        return  # nothing to join (and an empty tensor's other dims may be huge: no loop over them)
    if dim is None:
        file, info, digest = parts[0]
        out.copy(file, info.start, info.nbytes, digest)
        return
    shape = entry["shape"]
    outer = 1
    for d in shape[:dim]:
        outer *= d
    if outer == 1:
        for file, info, digest in parts:
            out.copy(file, info.start, info.nbytes, digest)
        return
    widths = [info.nbytes // outer for _, info, _ in parts]  # each rank's bytes per outer row
    row = sum(widths)
    step = max(1, CHUNK // max(row, 1))
    for o0 in range(0, outer, step):
        k = min(step, outer - o0)
        rows = np.empty((k, row), dtype=np.uint8)
        col = 0
        for (file, info, digest), w in zip(parts, widths):
            part = bytearray(k * w)
            file.read_into(info.start + o0 * w, memoryview(part))  # EOFError when cut short: the pins name the file
            digest.read(info.start + o0 * w, part)
            rows[:, col:col + w] = np.frombuffer(part, dtype=np.uint8).reshape(k, w)  # one strided copy, not k slices
            col += w
        out.write(rows)


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

