"""A checkpoint folder as stored: shards (headers only), index, config files, other files.

Opening a checkpoint reads only headers and small JSON files. Everything that can be wrong
with the folder's structure (missing shards, duplicate tensors, pickles, links escaping the
folder) is reported here, before any plan is made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from repair.errors import BadInput
from repair.io.names import check_name, regular_file
from repair.io.parse import collector_paused, parse_json, read_text
from repair.io.pins import PinnedFile, Pins
from repair.io.safetensors import ShardHeader, TensorInfo, read_header

if TYPE_CHECKING:
    from repair.io.byte_source import ByteSource

CONFIG = "config.json"
MISTRAL_PARAMS = "params.json"  # Mistral's own format (Mistral Large 3 is published only so): its config, not read here
HF_QUANT_CONFIG = "hf_quant_config.json"
INDEX_SUFFIX = ".safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """What a checkpoint folder stores; tensor data is never loaded here."""

    root: Path
    shards: tuple[ShardHeader, ...]
    index_name: str | None
    index: dict | None
    config: dict | None
    hf_quant_config: dict | None
    other_files: tuple[str, ...]  # relative paths copied through unchanged (tokenizer, card, ...)
    pins: Pins = field(default_factory=Pins, repr=False)  # every file above, opened once (empty: read by path, e.g. a Hub mirror)
    byte_source: ByteSource | None = field(default=None, repr=False)  # None: the shard files hold every byte (see io/byte_source.py)

    def shard_name(self, shard: ShardHeader) -> str:
        return shard.path.name

    def locate(self) -> dict[str, tuple[ShardHeader, TensorInfo]]:
        """Every tensor name -> (its shard, its stored info); built once (callers only read it), so
        looking tensors up stays O(1) however often it is asked for."""
        return self._located

    def infos(self) -> dict[str, TensorInfo]:
        return self._infos

    @cached_property
    def _located(self) -> dict[str, tuple[ShardHeader, TensorInfo]]:
        with collector_paused():
            return {t.name: (s, t) for s in self.shards for t in s.tensors}

    @cached_property
    def _infos(self) -> dict[str, TensorInfo]:
        return {name: info for name, (_, info) in self._located.items()}

    def input(self, name: str) -> PinnedFile:
        """The handle a file of this checkpoint is read through: the one pinned at open, else opened now."""
        path = self.root / name
        return self.pins.get(path) or PinnedFile(path)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


def open_checkpoint(path: Path, *, pin: bool = True, pins: Pins | None = None) -> Checkpoint:
    """Read a local checkpoint folder's headers and configs, validating its structure.

    With `pin`, every file is opened once here and read through that handle from then on (io/pins.py);
    a folder our own run is still filling in (a Hub mirror) is opened with `pin=False`. `pins`: files already
    pinned (verified downloads), read through those handles; with `pin=False`, the others are read by path.
    """
    root = Path(path)
    if not root.is_dir():
        raise BadInput(f"{root}: not a folder; give the checkpoint's folder (or a Hub repo id)")
    files = _list_files(root)
    if MISTRAL_PARAMS in files and CONFIG not in files:
        raise BadInput(f"{root / MISTRAL_PARAMS}: Mistral's own format (params.json, no config.json), whose architecture "
                       "and quantization ckpt-repair does not read; give the checkpoint in Hugging Face's format "
                       "(config.json beside its safetensors)")
    shard_names = sorted(f for f in files if f.endswith(".safetensors") and "/" not in f)
    if not shard_names:
        _refuse_without_safetensors(root, files)
    pins = pins if pins is not None else Pins()
    pinned = (lambda name: _pinned(pins, root / name)) if pin else (lambda name: pins.get(root / name))
    index_name, index = _read_index(root, files, pinned)
    with collector_paused():
        shards = tuple(read_header(root / name, pinned(name)) for name in _indexed_shards(root, shard_names, index))
    _check_unique(root, shards)
    if index is not None:
        _check_index(root, index_name, index, shards)
    used = set(s.path.name for s in shards) | {CONFIG, HF_QUANT_CONFIG} | ({index_name} if index_name else set())
    other_files = tuple(f for f in files if f not in used)  # subfolders' .safetensors too: copied, never repaired
    for name in other_files:
        pinned(name)
    return Checkpoint(
        root=root,
        shards=shards,
        index_name=index_name,
        index=index,
        config=read_json(root / CONFIG, pinned(CONFIG)) if CONFIG in files else None,
        hf_quant_config=read_json(root / HF_QUANT_CONFIG, pinned(HF_QUANT_CONFIG)) if HF_QUANT_CONFIG in files else None,
        other_files=other_files,
        pins=pins,
    )


def _pinned(pins: Pins, path: Path):
    try:
        return pins.pin(path)
    except OSError as exc:
        raise BadInput(f"{path}: cannot read ({exc.strerror}); check the path and permissions") from None


MAX_JSON_BYTES = 1 << 30  # far above any config, index or tp manifest; a larger one is refused before it is read whole


def read_json(path: Path, pinned: PinnedFile | None = None) -> dict:
    """A small JSON object file (read through `pinned` when given), or BadInput naming the file and the defect."""
    fix = "fix or re-download it"
    if pinned is not None and pinned.content is None and pinned.size > MAX_JSON_BYTES:  # a sparse terabyte: no traceback
        raise BadInput(f"{path}: {pinned.size} bytes, over the {MAX_JSON_BYTES} a JSON file of a checkpoint can hold; {fix}")
    value = parse_json((pinned.content or pinned.read_all()) if pinned is not None else read_text(path, fix), path, fix)
    if not isinstance(value, dict):
        raise BadInput(f"{path}: expected a JSON object, found {type(value).__name__}; {fix}")
    return value


def _list_files(root: Path) -> list[str]:
    """Relative paths of all files below root: regular files only (a FIFO would block every read),
    and links must stay inside it (or in an HF cache's blobs)."""
    allowed = [root.resolve()]
    real = allowed[0]  # the layout of the folder itself, however it was spelled (`.`, `../<sha>`, a link to it)
    blobs = real.parent.parent / "blobs"
    if real.parent.name == "snapshots" and blobs.is_dir() and not blobs.is_symlink():
        allowed.append(blobs.resolve())  # a huggingface_hub cache snapshot links into ../../blobs, a real folder
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") or d == ".")
        for name in sorted(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if rel.startswith(".") or "/." in rel:
                continue  # hidden files (.git, .cache) are not part of the checkpoint
            if full.is_symlink():
                _check_link(full, allowed)
            regular_file(full, "remove it from the checkpoint folder")
            found.append(rel)
    return found


def _check_link(link: Path, allowed: list[Path]) -> None:
    """A link must resolve to an existing file inside the folder: never read (or copy) what lies outside."""
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # dangling, or a loop
        raise BadInput(f"{link}: symlink is broken (its target is missing or loops); restore the file or remove the link") from None
    if not any(target.is_relative_to(a) for a in allowed):
        raise BadInput(f"{link}: symlink points outside the checkpoint folder (to {target}); copy the file in instead")


def _refuse_without_safetensors(root: Path, files: list[str]) -> None:
    pickles = [f for f in files if f.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise BadInput(
            f"{root / pickles[0]}: pickle checkpoints are refused (loading them can run code); "
            "convert to safetensors first"
        )
    if "tp_manifest.json" in files:  # repair/tp/manifest.py's MANIFEST: the folder `fix --tp` wrote, its ranks below it
        raise BadInput(f"{root}: the per-rank output of an earlier `fix --tp`, not a checkpoint; run `ckpt-repair unshard` on it "
                       "first, then use the checkpoint it rebuilds")
    raise BadInput(f"{root}: no .safetensors files found; give a safetensors checkpoint folder")


def _read_index(root: Path, files: list[str], pinned) -> tuple[str | None, dict | None]:
    names = [f for f in files if f.endswith(INDEX_SUFFIX) and "/" not in f]
    if not names:
        return None, None
    if len(names) > 1:
        raise BadInput(f"{root}: several index files ({', '.join(names)}); keep the one that matches the shards")
    index = read_json(root / names[0], pinned(names[0]))
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise BadInput(f"{root / names[0]}: missing or invalid 'weight_map'; fix or re-download the index")
    for shard in set(weight_map.values()):
        check_name(shard, root / names[0], "fix the index's weight_map")
    if not isinstance(index.get("metadata", {}), (dict, type(None))):
        raise BadInput(f"{root / names[0]}: 'metadata' is not an object; fix or re-download the index")
    return names[0], index


def _indexed_shards(root: Path, shard_names: list[str], index: dict | None) -> list[str]:
    if index is None:
        return shard_names
    for shard in sorted(set(index["weight_map"].values())):
        if shard not in shard_names:
            raise BadInput(f"{root / shard}: named in the index but missing; download the missing shard")
    return shard_names


def _check_unique(root: Path, shards: tuple[ShardHeader, ...]) -> None:
    seen: dict[str, str] = {}
    for shard in shards:
        shard_name = shard.path.name
        for t in shard.tensors:
            if t.name in seen:
                raise BadInput(f"{root}: tensor {t.name} is stored in both {seen[t.name]} and {shard_name}; remove the stale shard")
            seen[t.name] = shard_name


def _check_index(root: Path, index_name: str, index: dict, shards: tuple[ShardHeader, ...]) -> None:
    weight_map: dict[str, str] = index["weight_map"]
    for shard in shards:
        shard_name = shard.path.name
        for t in shard.tensors:
            where = weight_map.get(t.name)
            if where != shard_name:
                said = f"says it is in {where}" if where else "does not list it"
                raise BadInput(f"{root / index_name}: {t.name} is in {shard_name} but the index {said}; fix the index")
    if len(weight_map) > sum(len(s.tensors) for s in shards):  # every stored tensor is listed: any extra is not stored
        stored = {t.name for s in shards for t in s.tensors}
        name, shard = next((n, s) for n, s in weight_map.items() if n not in stored)
        raise BadInput(f"{root / shard}: tensor {name} is listed in the index but not stored; re-download the shard")
