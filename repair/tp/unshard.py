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

import hashlib
import struct
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from repair.errors import BadInput
from repair.io.atomic import build_atomically, check_files, check_header, write_json
from repair.io.dtypes import nbytes
from repair.io.hashing import copy_file_hashed, copy_hashed, sha256_file, write_all
from repair.io.names import file_type_problem, regular_file
from repair.io.safetensors import TensorInfo, read_header
from repair.io.shard_writer import OutTensor, encode_header
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
    manifest = read_manifest(src)
    ranks = _check_ranks(manifest)
    return build_atomically(src, out, overwrite, lambda tmp: _build(src, manifest, ranks, tmp, out))


def _check_ranks(manifest: Manifest) -> list[dict[str, TensorInfo]]:
    """Every rank file a regular file with the sha256 the manifest records; returns each rank's tensor infos."""
    infos = []
    for rank in manifest.ranks:
        for path, digest in rank.files.values():
            if file_type_problem(path) == "is missing":
                raise BadInput(f"{path}: missing; the tp output is incomplete, re-run `fix --tp`")
            regular_file(path, "re-run `fix --tp`")  # stat first: hashing a FIFO would block forever
            if sha256_file(path) != digest:
                raise BadInput(f"{path}: sha256 differs from {MANIFEST}; the file was changed or damaged, re-run `fix --tp`")
        infos.append(read_header(rank.files[RANK_FILE][0]).by_name())
    return infos


def _build(src: Path, manifest: Manifest, ranks: list[dict[str, TensorInfo]], tmp: Path, out: Path) -> UnshardResult:
    hashes: dict[str, str] = {}
    with ExitStack() as stack:
        fds = [stack.enter_context(open(r.files[RANK_FILE][0], "rb")).fileno() for r in manifest.ranks]
        for shard in manifest.shards:
            _parent(tmp, shard["name"])
            hashes[shard["name"]] = _write_shard(tmp / shard["name"], shard, manifest.tensors, ranks, fds)
    for name in manifest.files:
        hashes[name] = copy_file_hashed(manifest.ranks[0].files[name][0], _parent(tmp, name))
    if manifest.index:
        name, text = manifest.index
        _parent(tmp, name).write_bytes(text.encode("utf-8"))
        hashes[name] = sha256_file(tmp / name)
    report = unshard_report(src, sha256_file(manifest.path), manifest.tp, manifest.source, hashes)
    write_json(tmp / REPORT_NAME, report)
    _self_check(tmp, out, manifest, set(hashes) | {REPORT_NAME})
    return UnshardResult(out, report)


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


def _write_shard(path: Path, shard: dict, tensors: dict, ranks: list[dict[str, TensorInfo]], fds: list[int]) -> str:
    """Stream one standard shard: header, then each tensor rebuilt from the ranks; returns its sha256."""
    digest = hashlib.sha256()
    with open(path, "wb", buffering=0) as fh:
        out = _Sink(fh.fileno(), digest)
        out.append(_header(shard, tensors))
        for name in shard["tensors"]:
            entry = tensors[name]
            parts = [_rank_info(ranks[r], name, entry, r) for r in range(len(ranks))]
            before = out.written
            _concat(out, entry, parts, fds)
            if out.written - before != nbytes(entry["dtype"], tuple(entry["shape"])):
                raise BadInput(f"{name}: the ranks' slices do not add up to {entry['shape']}; the manifest and rank files disagree")
    return digest.hexdigest()


class _Sink:
    """An output file being appended to, hashed on the way."""

    def __init__(self, fd: int, digest):
        self.fd, self.digest, self.written = fd, digest, 0

    def append(self, data) -> None:
        view = memoryview(data).cast("B")
        self.digest.update(view)
        write_all(self.fd, view)
        self.written += view.nbytes

    def copy(self, src_fd: int, offset: int, length: int) -> None:
        copy_hashed(src_fd, self.fd, offset, length, self.digest)
        self.written += length


def _rank_info(infos: dict[str, TensorInfo], name: str, entry: dict, rank: int) -> TensorInfo:
    info = infos.get(name)
    want = tuple(entry["ranks"][rank]["shape"])
    if info is None or info.shape != want or info.dtype != entry["dtype"]:
        found = "missing" if info is None else f"{info.dtype} {list(info.shape)}"
        raise BadInput(f"rank {rank}: {name} is {found}, the manifest says {entry['dtype']} {list(want)}; re-run `fix --tp`")
    return info


def _concat(out: _Sink, entry: dict, parts: list[TensorInfo], fds: list[int]) -> None:
    """Write the full tensor: rank 0's copy when replicated, else the ranks' slices joined along `dim`."""
    dim = entry["dim"]
    if nbytes(entry["dtype"], tuple(entry["shape"])) == 0:
        return  # nothing to join (and an empty tensor's other dims may be huge: no loop over them)
    if dim is None:
        out.copy(fds[0], parts[0].start, parts[0].nbytes)
        return
    shape = entry["shape"]
    outer = 1
    for d in shape[:dim]:
        outer *= d
    if outer == 1:
        for fd, info in zip(fds, parts):
            out.copy(fd, info.start, info.nbytes)
        return
    widths = [info.nbytes // outer for info in parts]  # each rank's bytes per outer row
    row = sum(widths)
    step = max(1, CHUNK // max(row, 1))
    for o0 in range(0, outer, step):
        k = min(step, outer - o0)
        buf = bytearray(k * row)
        col = 0
        for fd, info, w in zip(fds, parts, widths):
            part = bytearray(k * w)
            pread_exact(fd, info.start + o0 * w, memoryview(part), info.name)
            for i in range(k):
                buf[i * row + col: i * row + col + w] = part[i * w:(i + 1) * w]
            col += w
        out.append(buf)


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

