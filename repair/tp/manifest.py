"""tp_manifest.json as `unshard` reads it: every value checked before anything is opened or written.

A `fix --tp` output is made to be shared, so its manifest is hostile data: each file or folder
name must be a plain relative name inside its folder (repair/io/names.py), each rank file a
regular file inside its rank folder, each tensor's split consistent with its shape, and no two
output names may collide. Anything else is one BadInput line naming the manifest and the key.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from repair.errors import BadInput
from repair.io.checkpoint import read_json
from repair.io.dtypes import ITEMSIZE, nbytes
from repair.io.output import REPORT_NAME
from repair.io.names import file_type_problem, inside, name_problem, regular_file
from repair.io.pins import Pins
from repair.io.safetensors import parse_header
from repair.targets.tp_rules import MAX_RANKS

MANIFEST = "tp_manifest.json"
RANK_FILE = "model.safetensors"
FORMAT = "ckpt-repair-tp"
MAX_TP = MAX_RANKS
_SHA256 = re.compile(r"[0-9a-f]{64}")
_FIX = "re-run `fix --tp` (names must be plain relative names inside the folder)"


def rank_folder(rank: int) -> str:
    return f"rank-{rank}"


@dataclass(frozen=True)
class RankFiles:
    """One rank's folder and its files' recorded sha256, every path proven inside SRC."""

    folder: Path
    files: dict[str, tuple[Path, str]]  # name -> (path, sha256)
    sizes: dict[str, int]  # name -> bytes, for each file (empty from a manifest written before sizes were recorded)


@dataclass(frozen=True)
class Manifest:
    """A checked manifest: `standard` and `tensors` keep the JSON's shape, with every value validated."""

    path: Path
    tp: int
    source: str  # the folder `fix --tp` read, recorded in unshard's report
    ranks: tuple[RankFiles, ...]
    shards: tuple[dict, ...]  # {"name", "metadata", "tensors", optional "header"}
    files: tuple[str, ...]  # small files copied from rank 0
    index: tuple[str, str] | None  # (name, text)
    tensors: dict[str, dict]  # name -> {"dtype", "shape", "dim", "ranks": [{"shape"}]}


class _Bad(Exception):
    """A defect at a key path; read_manifest turns it into one BadInput line."""


def read_manifest(src: Path, pins: Pins | None = None) -> Manifest:
    """The manifest at SRC, checked end to end, or BadInput naming the key that is wrong. With `pins`, it is
    read through a handle pinned there (unshard: its sha256 is then of the bytes parsed)."""
    path = src / MANIFEST
    if file_type_problem(path) == "is missing":
        raise BadInput(f"{src}: no {MANIFEST}; give the folder `ckpt-repair fix --tp N` wrote")
    regular_file(path)  # stat first: reading a FIFO would block forever
    raw = read_json(path, pins.pin(path) if pins is not None else None)
    if raw.get("format") != FORMAT or raw.get("version") != 1:
        raise BadInput(f"{path}: not a version-1 {FORMAT} manifest; this tool cannot unshard it")
    try:
        return _checked(src, path, raw)
    except _Bad as bad:
        raise BadInput(f"{path}: {bad}; the manifest is damaged or was edited, {_FIX}") from None


def _checked(src: Path, path: Path, raw: dict) -> Manifest:
    tp = _int(raw.get("tp"), "tp", 1, MAX_TP)
    ranks = tuple(_rank(src, r, i) for i, r in enumerate(_list(raw.get("ranks"), "ranks", tp)))
    standard = _dict(raw.get("standard"), "standard")
    tensors = {_text(n, "tensors key"): _tensor(e, f"tensors[{n!r}]", tp) for n, e in _dict(raw.get("tensors"), "tensors").items()}
    shards = tuple(_shard(s, f"standard.shards[{i}]", tensors) for i, s in enumerate(_list(standard.get("shards"), "standard.shards")))
    files = tuple(_name(n, f"standard.files[{i}]") for i, n in enumerate(_list(standard.get("files"), "standard.files")))
    for name in files:
        if name not in ranks[0].files or name == RANK_FILE:
            raise _Bad(f"standard.files names {name!r}, which ranks[0] does not record")
    index = standard.get("index")
    if index is not None:
        index = (_name(_dict(index, "standard.index").get("name"), "standard.index.name"), _text(index.get("text"), "standard.index.text"))
    _no_collisions([s["name"] for s in shards] + list(files) + ([index[0]] if index else []))
    _each_tensor_once(shards, tensors)
    if index is not None:
        _index_agrees(index, shards)
    return Manifest(path, tp, _text(raw.get("source"), "source"), ranks, shards, files, index, tensors)


def _rank(src: Path, rank: object, number: int) -> RankFiles:
    key = f"ranks[{number}]"
    rank = _dict(rank, key)
    folder_name = _name(rank.get("folder"), f"{key}.folder")
    want = rank_folder(number)
    if folder_name != want:
        raise _Bad(f"{key}.folder {folder_name!r} is not {want!r}")
    folder = inside(src, folder_name, src / MANIFEST, _FIX)
    files = {}
    for name, digest in _dict(rank.get("files"), f"{key}.files").items():
        name = _name(name, f"{key}.files")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise _Bad(f"{key}.files[{name!r}] is not a sha256 hex digest")
        files[name] = (inside(folder, name, src / MANIFEST, _FIX), digest)
    if RANK_FILE not in files:
        raise _Bad(f"{key}.files does not record {RANK_FILE}")
    sizes = rank.get("sizes")
    if sizes is not None:
        sizes = {_name(n, f"{key}.sizes"): _int(v, f"{key}.sizes[{n!r}]", 0, 2**63) for n, v in _dict(sizes, f"{key}.sizes").items()}
        if set(sizes) != set(files):
            raise _Bad(f"{key}.sizes does not record the files {key}.files records")
    return RankFiles(folder, files, sizes or {})


def _tensor(entry: object, key: str, tp: int) -> dict:
    entry = _dict(entry, key)
    dtype = entry.get("dtype")
    if not isinstance(dtype, str) or dtype not in ITEMSIZE:
        raise _Bad(f"{key}.dtype {dtype!r} is not a safetensors dtype")
    shape = _shape(entry.get("shape"), f"{key}.shape")
    dim = entry.get("dim")
    if dim is not None:
        dim = _int(dim, f"{key}.dim", 0, len(shape) - 1)
    ranks = [_shape(_dict(r, f"{key}.ranks[{i}]").get("shape"), f"{key}.ranks[{i}].shape")
             for i, r in enumerate(_list(entry.get("ranks"), f"{key}.ranks", tp))]
    for i, part in enumerate(ranks):
        if len(part) != len(shape) or any(a != b for d, (a, b) in enumerate(zip(part, shape)) if d != dim):
            raise _Bad(f"{key}.ranks[{i}].shape {part} does not fit shape {shape} split along dim {dim}")
    if dim is not None and sum(p[dim] for p in ranks) != shape[dim]:
        raise _Bad(f"{key}: the ranks' sizes along dim {dim} do not add up to {shape[dim]}")
    return {"dtype": dtype, "shape": shape, "dim": dim, "ranks": [{"shape": p} for p in ranks]}


def _shard(shard: object, key: str, tensors: dict) -> dict:
    shard = _dict(shard, key)
    name = _name(shard.get("name"), f"{key}.name")
    names = [_text(n, f"{key}.tensors") for n in _list(shard.get("tensors"), f"{key}.tensors")]
    for n in names:
        if n not in tensors:
            raise _Bad(f"{key} lists tensor {n!r}, which the manifest's tensors do not describe")
    metadata = shard.get("metadata")
    if metadata is not None:
        metadata = {_text(k, f"{key}.metadata key"): _text(v, f"{key}.metadata[{k!r}]") for k, v in _dict(metadata, f"{key}.metadata").items()}
    checked = {"name": name, "metadata": metadata, "tensors": names}
    if "header" in shard:
        checked["header"] = _verbatim_header(_text(shard["header"], f"{key}.header"), f"{key}.header", names, tensors)
    return checked


def _verbatim_header(text: str, key: str, names: list[str], tensors: dict) -> str:
    """A source's own header, kept verbatim: it must parse and describe exactly the listed tensors."""
    raw = text.encode("utf-8")
    size = 8 + len(raw) + sum(nbytes(tensors[n]["dtype"], tuple(tensors[n]["shape"])) for n in names)
    try:
        header = parse_header(Path(key), raw, size)
    except BadInput as err:
        raise _Bad(str(err)) from None
    if [(t.name, t.dtype, list(t.shape)) for t in header.tensors] != [(n, tensors[n]["dtype"], tensors[n]["shape"]) for n in names]:
        raise _Bad(f"{key} does not describe the shard's tensors")
    return text


def _no_collisions(names: list[str]) -> None:
    """Output names are distinct, and none is a folder of another (that would write one into the other)."""
    seen, folders = set(), set()
    for name in names:
        parts = name.split("/")
        folders.update("/".join(parts[:i]) for i in range(1, len(parts)))
        if name in seen or name == REPORT_NAME:  # unshard writes its own report
            raise _Bad(f"output name {name!r} appears twice or is the report's")
        seen.add(name)
    if seen & folders:
        raise _Bad(f"output name {sorted(seen & folders)[0]!r} is also used as a folder")


def _each_tensor_once(shards: tuple[dict, ...], tensors: dict) -> None:
    """Every described tensor is in exactly one standard shard."""
    seen: set[str] = set()
    for shard in shards:
        for name in shard["tensors"]:
            if name in seen:
                raise _Bad(f"tensor {name!r} is listed in two standard shards")
            seen.add(name)
    if len(seen) != len(tensors):
        raise _Bad(f"{len(tensors) - len(seen)} tensor(s) of 'tensors' are in no standard shard")


def _index_agrees(index: tuple[str, str], shards: tuple[dict, ...]) -> None:
    """The index's weight_map maps every tensor to the shard that holds it, and nothing else."""
    placed = {n: s["name"] for s in shards for n in s["tensors"]}
    try:
        weight_map = json.loads(index[1]).get("weight_map")
    except (ValueError, AttributeError, RecursionError):
        weight_map = None
    if weight_map != placed:
        raise _Bad(f"standard.index {index[0]!r} does not map every tensor to its shard")


def _name(value: object, key: str) -> str:
    why = name_problem(value)
    if why is None and any(part.startswith(".") for part in str(value).split("/")):
        why = "is hidden (fix --tp never writes hidden files)"
    if why:
        raise _Bad(f"{key} {value!r} {why}")
    return str(value)


def _text(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise _Bad(f"{key} is not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Bad(f"{key} is not valid Unicode text") from None
    return value


def _int(value: object, key: str, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise _Bad(f"{key} {value!r} is not an integer in [{low}, {high}]")
    return value


def _shape(value: object, key: str) -> list[int]:
    return [_int(d, key, 0, 2**53) for d in _list(value, key)]


def _list(value: object, key: str, length: int | None = None) -> list:
    if not isinstance(value, list) or (length is not None and len(value) != length):
        raise _Bad(f"{key} is not a list" + (f" of {length} entries" if length is not None else ""))
    return value


def _dict(value: object, key: str) -> dict:
    if not isinstance(value, dict):
        raise _Bad(f"{key} is missing or not an object")
    return value
