"""`unshard`: rebuild the standard checkpoint from `fix --tp` output, byte for byte.

Reads tp_manifest.json and checks every rank file against its recorded sha256 first. Each
standard shard is then written with the manifest's header (canonical, or the source's own
verbatim) and every tensor is concatenated back from the ranks' slices, streaming: dim-0 splits
are copied rank after rank, other dims interleaved a few MiB of rows at a time, replicated
tensors copied from rank 0. Config and other small files come from rank-0, the index from the
manifest. Only repair_report.json differs from the non-TP `fix` output: it records this unshard.
"""

from __future__ import annotations

import hashlib
import json
import struct
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from repair import __version__
from repair.errors import BadInput, InternalError
from repair.execute import own_output
from repair.io.checkpoint import plain_name, read_json
from repair.io.dtypes import nbytes
from repair.io.hashing import copy_file_hashed, copy_hashed, sha256_file, write_all
from repair.io.safetensors import OutTensor, TensorInfo, encode_header, read_header
from repair.io.staging import MARKER
from repair.report import REPORT_NAME
from repair.tp_io import build_atomically, pread_exact, write_json
from repair.tp_write import FORMAT, MANIFEST, RANK_FILE, rank_folder

CHUNK = 8 << 20  # bytes of interleaved rows assembled at a time
CHECK = "the check of the rebuilt checkpoint"


@dataclass(frozen=True)
class UnshardResult:
    out: Path
    report: dict


def unshard(src: Path, out: Path, *, overwrite: bool = False) -> UnshardResult:
    """Reassemble `fix --tp` output at SRC into a standard checkpoint at OUT, atomically."""
    src, out = Path(src), Path(out)
    manifest = _read_manifest(src)
    ranks = _check_ranks(src, manifest)
    return build_atomically(src, out, overwrite, lambda tmp: _build(src, manifest, ranks, tmp, out))


def _read_manifest(src: Path) -> dict:
    path = src / MANIFEST
    if not path.is_file():
        raise BadInput(f"{src}: no {MANIFEST}; give the folder `ckpt-repair fix --tp N` wrote")
    manifest = read_json(path)
    if manifest.get("format") != FORMAT or manifest.get("version") != 1:
        raise BadInput(f"{path}: not a version-1 {FORMAT} manifest; this tool cannot unshard it")
    problem = _ranks_problem(manifest) or layout_problem(manifest)
    if problem:
        raise BadInput(f"{path}: {problem}; the manifest was changed or damaged, re-run `fix --tp`")
    return manifest


def _ranks_problem(manifest: dict) -> str | None:
    """The ranks the manifest names must be rank-0 .. rank-(tp-1), each listing plain file names."""
    ranks, tp = manifest.get("ranks"), manifest.get("tp")
    if type(tp) is not int or tp < 1 or not isinstance(ranks, list) or len(ranks) != tp:
        return "its 'tp' and 'ranks' disagree"
    for r, rank in enumerate(ranks):
        if not isinstance(rank, dict) or rank.get("folder") != rank_folder(r) or not isinstance(rank.get("files"), dict):
            return f"rank {r} is not described as folder {rank_folder(r)} with its files"
        if RANK_FILE not in rank["files"] or not all(plain_name(n) for n in rank["files"]):
            return f"rank {r} does not list {RANK_FILE}, or lists a file name that leaves its folder"
    return None


def layout_problem(manifest: dict) -> str | None:
    """What is wrong with the standard layout a manifest describes, or None: plain, distinct file names;
    every tensor in exactly one shard; the index's weight_map agreeing with the shards."""
    standard, tensors = manifest.get("standard"), manifest.get("tensors")
    if not isinstance(standard, dict) or not isinstance(tensors, dict) or not isinstance(standard.get("shards"), list):
        return "no standard layout (standard.shards, tensors)"
    index = standard.get("index")
    files = [s.get("name") if isinstance(s, dict) else None for s in standard["shards"]] + list(standard.get("files") or [])
    files += [index.get("name")] if isinstance(index, dict) else []
    for name in files:
        if not plain_name(name) or name == REPORT_NAME or files.count(name) > 1:
            return f"output file name {name!r} is not a plain file name, is the report's, or appears twice"
    placed: dict[str, str] = {}
    for shard in standard["shards"]:
        for name in shard.get("tensors") or []:
            if not isinstance(name, str) or name in placed or name not in tensors:
                return f"tensor {name!r} is in two shards or has no entry in 'tensors'"
            placed[name] = shard["name"]
    if placed.keys() != tensors.keys():
        return f"{len(tensors.keys() - placed.keys())} tensor(s) of 'tensors' are in no shard"
    if isinstance(index, dict) and _weight_map(index) != placed:
        return f"the index {index['name']} does not map every tensor to its shard"
    return None


def _weight_map(index: dict) -> dict | None:
    try:
        return json.loads(index.get("text")).get("weight_map")
    except (TypeError, ValueError, AttributeError):
        return None


def _check_ranks(src: Path, manifest: dict) -> list[dict[str, TensorInfo]]:
    """Every rank file present with the sha256 the manifest records; returns each rank's tensor infos."""
    infos = []
    for rank in manifest["ranks"]:
        folder = src / rank["folder"]
        for name, digest in rank["files"].items():
            path = folder / name
            if not path.is_file():
                raise BadInput(f"{path}: missing; the tp output is incomplete, re-run `fix --tp`")
            if sha256_file(path) != digest:
                raise BadInput(f"{path}: sha256 differs from {MANIFEST}; the file was changed or damaged, re-run `fix --tp`")
        infos.append(read_header(folder / RANK_FILE).by_name())
    return infos


def _build(src: Path, manifest: dict, ranks: list[dict[str, TensorInfo]], tmp: Path, out: Path) -> UnshardResult:
    standard = manifest["standard"]
    hashes: dict[str, str] = {}
    rank_files = [src / r["folder"] / RANK_FILE for r in manifest["ranks"]]
    with ExitStack() as stack:
        fds = [stack.enter_context(open(p, "rb")).fileno() for p in rank_files]
        for shard in standard["shards"]:
            hashes[shard["name"]] = _write_shard(tmp / shard["name"], shard, manifest["tensors"], ranks, fds)
    first = src / manifest["ranks"][0]["folder"]
    for name in standard["files"]:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        hashes[name] = copy_file_hashed(first / name, tmp / name)
    index = standard.get("index")
    if index:
        (tmp / index["name"]).write_bytes(index["text"].encode("utf-8"))
        hashes[index["name"]] = sha256_file(tmp / index["name"])
    report = {
        "tool": {"name": "ckpt-repair", "version": __version__}, "operation": "unshard",
        "source": {"path": str(src), "manifest_sha256": sha256_file(src / MANIFEST), "tp": manifest["tp"], "fixed_from": manifest["source"]},
        "outputs": [{"name": n, "sha256": h} for n, h in sorted(hashes.items())],
    }
    write_json(tmp / REPORT_NAME, report)
    _self_check(tmp, out, standard, manifest["tensors"], set(hashes) | {REPORT_NAME})
    return UnshardResult(out, report)


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


def _self_check(tmp: Path, out: Path, standard: dict, tensors: dict, expected: set[str]) -> None:
    """Re-open every rebuilt shard and compare its header with the manifest before anything is published."""
    found = {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()} - {MARKER}
    if found != expected:
        raise InternalError(CHECK, f"{out}: written files differ from the manifest ({', '.join(sorted(found ^ expected))})")
    for shard in standard["shards"]:
        with own_output(tmp, out):
            got = [(t.name, t.dtype, list(t.shape)) for t in read_header(tmp / shard["name"]).tensors]
        want = [(n, tensors[n]["dtype"], tensors[n]["shape"]) for n in shard["tensors"]]
        if got != want:
            raise InternalError(CHECK, f"{out / shard['name']}: rebuilt header does not match the manifest")


def unshard_text(result: UnshardResult) -> str:
    files = [o["name"] for o in result.report["outputs"]]
    return f"wrote {result.out}: the standard checkpoint rebuilt from {result.report['source']['tp']} rank(s) ({len(files)} files)"

