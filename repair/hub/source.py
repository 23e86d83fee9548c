"""A Hub repo as a Checkpoint, from safetensors headers and a few byte ranges, never whole shards.

`resolve` (repair.hub.remote) pins the revision to a commit sha and lists the files at that sha;
everything after uses the sha. `open_remote` builds a mirror folder: the small JSON files
(config.json, hf_quant_config.json, the index) downloaded, and each top-level shard as a *sparse*
file of its real size holding only its first bytes (the header, and what else one speculative read of
FIRST_READ bytes brought) and, with `scales`, the per-tensor scalars doctor checks (global, input, FP8 weight
and KV scales) — so `open_checkpoint` validates it exactly as it validates a local folder. Block scales
are fetched only where a plan changes their module (`RemoteBytes.store`, from `api.plan`) or `doctor
--deep` streams them (never stored); see repair/hub/ranges.py for how ranges are read. The returned Checkpoint's root is the label `owner/name@sha`; its shard paths point into
the mirror. Bytes outside the fetched ranges are holes: only `fetch_shard` (whole file) makes a
shard readable beyond them, and `localize` downloads a full local copy for `fix -o OUT`.
"""

from __future__ import annotations

import atexit
import os
import shutil
import struct
import tempfile
import weakref
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Callable

from repair.codec.dequant_table import OUT_DTYPES
from repair.codec.scale_values import fp8_codes_needed
from repair.errors import BadInput, OutputError, RepairError
from repair.hub import client, ranges
from repair.hub.errors import hub_call
from repair.hub.ranges import RangeClient, RemoteBytes
from repair.hub.remote import RemoteRepo, resolve
from repair.hub.spec import hub_spec, local_path
from repair.hub.verify import verified
from repair.io import staging
from repair.io.pins import Pins
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, INDEX_SUFFIX, PICKLE_SUFFIXES, Checkpoint, open_checkpoint
from repair.io.safetensors import MAX_HEADER_BYTES, TensorInfo
from repair.formats.modules import split_name
from repair.formats.nvfp4_health import read_f32_scalar
from repair.planning.build import make_plan

SMALL_LIMIT = 64 << 20  # config and index files above this are refused rather than downloaded
# every value planning and doctor read (all small): the NVFP4 / FP8 scales by ModelOpt's and compressed-tensors'
# names, NVFP4_AWQ's pre_quant_scale, the KV cache's k_scale / v_scale. A value not listed reads as zeros.
SCALE_LEAVES = ("weight_scale", "weight_scale_2", "input_scale", "weight_global_scale", "input_global_scale",
                "pre_quant_scale", "k_scale", "v_scale")
COALESCE_GAP = ranges.GAP
FIRST_READ = 256 << 10  # a shard's first read: its header (DeepSeek-R1's are ~125 KB) and, as safetensors lays a
# shard out (float32 tensors first), its scalars; a longer header costs one more read
WORK_PREFIX = "ckpt-repair-hub-"


@dataclass(eq=False)
class RemoteSource:
    """What backs a remote Checkpoint: the pinned repo, its mirror folder and what the mirror holds."""

    repo: RemoteRepo
    folder: Path
    bytes: RemoteBytes = field(repr=False)  # the ranges each stand-in holds; every other byte on request
    complete: set[str] = field(default_factory=set)  # shards downloaded whole into the mirror

    @property
    def fetched(self) -> dict[str, list[tuple[int, int]]]:
        """Per shard name, the byte ranges its stand-in holds."""
        return {p.name: self.bytes.held(p) for p in self.folder.glob("*.safetensors")}


_REMOTE: "weakref.WeakKeyDictionary[Checkpoint, RemoteSource]" = weakref.WeakKeyDictionary()


def remote_of(ckpt: Checkpoint | None) -> RemoteSource | None:
    return None if ckpt is None else _REMOTE.get(ckpt)


def open_source(src: str | Path, *, scales: bool = True, work: Path | None = None, inputs: tuple[Path, ...] = ()) -> Checkpoint:
    """A local checkpoint folder, or a Hub repo id (`owner/name[@rev]`) opened from its headers.

    `scales=False` (inspect) reads headers only; otherwise the NVFP4 scale tensors are fetched too,
    by range, because planning and doctor check their values. The mirror lives in `work` or in a
    temporary folder removed when the process exits; making one never removes `inputs` (the local inputs).
    """
    spec = hub_spec(src)
    if spec is None:
        return open_checkpoint(Path(src))
    client.quiet_progress(True)
    repo = resolve(spec)
    return open_remote(repo, work if work is not None else temp_folder(inputs), scales=scales)


def temp_folder(inputs: tuple[Path, ...] = ()) -> Path:
    """A work folder removed when the process exits (and by a later run, if this one is killed)."""
    folder = work_folder(None, inputs)
    atexit.register(shutil.rmtree, folder, True)
    return folder


def work_folder(parent: Path | None = None, inputs: tuple[Path, ...] = ()) -> Path:
    """A new `ckpt-repair-hub-<pid>-*` folder in `parent` (default: the temp folder), marked like `fix`'s
    partial folders; first removes the ones killed runs left there (SIGKILL cannot be caught), never one
    of `inputs` (local SRC, --original) or a folder holding one, whatever its name and marker."""
    parent = Path(parent) if parent is not None else Path(tempfile.gettempdir())
    try:
        staging.remove_stale(parent, WORK_PREFIX, inputs)
        return staging.new_marked(parent, WORK_PREFIX)
    except OSError as exc:
        raise OutputError(f"{parent}: cannot create a work folder here ({exc.strerror or exc}); give a writable folder "
                          "with room as --workdir (or TMPDIR)") from None


def open_remote(repo: RemoteRepo, work: Path, *, scales: bool = True) -> Checkpoint:
    """The Checkpoint of a pinned repo, from a mirror under `work` (see the module docstring)."""
    folder = Path(work) / repo.repo.replace("/", "--") / repo.sha
    folder.mkdir(parents=True, exist_ok=True)
    shards = [n for n in repo.visible() if n.endswith(".safetensors") and "/" not in n]
    if not shards:
        _refuse_without_safetensors(repo)
    small = [n for n in (CONFIG, HF_QUANT_CONFIG) if n in repo.files] + [n for n in repo.visible() if n.endswith(INDEX_SUFFIX) and "/" not in n]
    pins = Pins()  # the small files, verified through the handles they are read by (hub/verify.py)
    for name in small:
        _download_small(repo, name, folder, pins)
    source = RemoteSource(repo, folder, RemoteBytes(RangeClient(repo.repo, repo.sha, repo.label), lambda path: path.name))
    client.map_threads(lambda name: _header_file(source, name), shards)
    with relabeled(folder, repo.label):
        base = open_checkpoint(folder, pin=False, pins=pins)  # shards are filled in later (fetch_tensors, fetch_shard): by path
    if scales:
        fetch_tensors(source, base, _scalar)
        codes = _fp8_codes_read(base)
        if codes:
            fetch_tensors(source, base, lambda t: t.name in codes)
    used = {s.path.name for s in base.shards} | {CONFIG, HF_QUANT_CONFIG} | ({base.index_name} if base.index_name else set())
    other = tuple(n for n in repo.visible() if n not in used and not n.endswith(".safetensors"))
    ckpt = replace(base, root=Path(repo.label), other_files=other, byte_source=source.bytes)
    _REMOTE[ckpt] = source
    return ckpt


def _scalar(t: TensorInfo) -> bool:
    """A per-tensor scale doctor reads by default (not a block-scale tensor or NVFP4_AWQ's per-column vector)."""
    leaf = split_name(t.name)[1]
    return leaf in SCALE_LEAVES and leaf != "pre_quant_scale" and not (leaf == "weight_scale" and t.dtype == "F8_E4M3")


def _fp8_codes_read(ckpt: Checkpoint) -> set[str]:
    """FP8 weights whose scale could carry a code past a 16-bit float's range: planning reads their codes
    (planning/dequantize.py `_check_fp8_scale`), so they are fetched too. Rare: real FP8 scales are far smaller."""
    infos = ckpt.infos()
    out = set()
    for name, info in infos.items():
        scale = infos.get(name.removesuffix("weight") + "weight_scale") if info.dtype == "F8_E4M3" and name.endswith(".weight") else None
        if scale is not None and scale.dtype == "F32" and scale.nbytes == 4 and \
                any(fp8_codes_needed(read_f32_scalar(scale.path, scale), dtype) for dtype in OUT_DTYPES):
            out.add(name)
    return out


def _refuse_without_safetensors(repo: RemoteRepo) -> None:
    pickles = [n for n in repo.visible() if n.endswith(PICKLE_SUFFIXES)]
    if pickles:
        raise BadInput(f"{repo.label}/{pickles[0]}: pickle checkpoints are refused (loading them can run code); convert to safetensors first")
    raise BadInput(f"{repo.label}: no .safetensors files at the top of the repo; give a safetensors checkpoint repo")


def _download_small(repo: RemoteRepo, name: str, folder: Path, pins: Pins) -> None:
    size = repo.files[name].size
    if size > SMALL_LIMIT:
        raise BadInput(f"{repo.label}/{name}: {size:,} bytes is far too large for a config or index file; the repo is broken")
    local_path(folder, name, repo.label)
    path = Path(folder) / name  # as open_checkpoint names it: it reads the file through the handle pinned here
    with hub_call(f"{repo.label}/{name}", missing="listed at the pinned commit but not downloadable; re-run"):
        client.download(repo.repo, repo.sha, name, local_dir=folder)
    verified(repo, name, path, pins=pins)


def _header_file(source: RemoteSource, name: str) -> None:
    """A sparse stand-in for one shard: the real size, its first FIRST_READ bytes (one ranged read; a second one
    for the rest of a longer header), holes elsewhere."""
    repo = source.repo
    size = repo.files[name].size
    path = local_path(source.folder, name, repo.label)
    data = b""
    with hub_call(f"{repo.label}/{name}"):
        if size:
            data = source.bytes.client.read(name, 0, min(size, FIRST_READ))
        if len(data) >= 8:
            (length,) = struct.unpack("<Q", data[:8])
            if len(data) < 8 + length <= min(size, 8 + MAX_HEADER_BYTES):
                data += source.bytes.client.read(name, len(data), 8 + length)
    with open(path, "wb") as fh:  # read_header then applies exactly the local checks to these bytes
        fh.write(data)
        fh.truncate(size)
    source.bytes.hold(path, [(0, len(data))])


def fetch_tensors(source: RemoteSource, ckpt: Checkpoint, wanted: Callable[[TensorInfo], bool]) -> int:
    """Fetch the bytes of the wanted tensors into the mirror's sparse files (ranged reads); bytes fetched."""
    before = source.bytes.transfer.bytes
    source.bytes.store([t for shard in ckpt.shards if shard.path.name not in source.complete for t in shard.tensors
                        if t.nbytes and wanted(t)], COALESCE_GAP)
    return source.bytes.transfer.bytes - before


def fetch_shard(source: RemoteSource, name: str, staging: Path, pins: Pins) -> Path:
    """Download one shard whole, put it in place of its sparse stand-in, and check it against the Hub's listing
    (repair.hub.verify) through the handle it is pinned by in `pins` (the remote Checkpoint's): every byte a
    rewrite reads comes through that handle. Returns the mirror path."""
    repo = source.repo
    target = local_path(source.folder, name, repo.label)
    with hub_call(f"{repo.label}/{name}", missing="listed at the pinned commit but not downloadable; re-run"):
        got = client.download(repo.repo, repo.sha, name, local_dir=staging)
    os.replace(got, target)
    verified(repo, name, source.folder / name, pins=pins)  # as the Checkpoint's shard names it
    source.complete.add(name)
    source.bytes.hold(target, [], whole=True)
    return target


def localize(ckpt: Checkpoint | None) -> Checkpoint | None:
    """A full local copy of a remote checkpoint (huggingface_hub's cache, at the pinned sha), opened as a
    local folder; local checkpoints are returned as they are."""
    source = remote_of(ckpt)
    if source is None:
        return ckpt
    repo = source.repo
    names = [s.path.name for s in ckpt.shards] + [n for n in (CONFIG, HF_QUANT_CONFIG, ckpt.index_name) if n and n in repo.files]
    names += list(ckpt.other_files)
    root, pins = None, Pins()
    for name in names:
        with hub_call(f"{repo.label}/{name}", missing="listed at the pinned commit but not downloadable; re-run"):
            path = client.download(repo.repo, repo.sha, name)
        # every byte that builds OUT, checked through the handle it is then read by (one read of the download)
        verified(repo, name, path, client.cache_dir(), pins)
        root = path.parents[len(PurePosixPath(name).parts) - 1]
    return open_checkpoint(root, pins=pins)


class relabeled:
    """Rewrite the mirror folder's path to the repo label in tool errors raised inside."""

    def __init__(self, folder: Path, label: str):
        self.folder, self.label = str(folder), label

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if isinstance(exc, RepairError) and self.folder in str(exc):
            exc.args = (str(exc).replace(self.folder, self.label),)
        return False


def labeled(*ckpts: Checkpoint | None) -> ExitStack:
    """Errors raised inside name a Hub checkpoint's files `owner/name@sha/file`, not by their mirror
    (a temp folder removed when the run ends); local checkpoints are left as they are."""
    stack = ExitStack()
    for source in filter(None, map(remote_of, ckpts)):
        stack.enter_context(relabeled(source.folder, source.repo.label))
    return stack


def localize_plan(plan):
    """The plan again on full local copies when its source or original is a Hub repo (else unchanged)."""
    src, orig = localize(plan.source), localize(plan.original)
    if src is plan.source and orig is plan.original:
        return plan
    return make_plan(src, plan.recipe, orig)
