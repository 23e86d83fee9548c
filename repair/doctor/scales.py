"""The scale bytes doctor's health checks read, decided and read before the checks run.

- Per-tensor scalars (weight_scale_2, input_scale, FP8 weight scales): one pread each, through one open file per
  shard. A Hub repo's mirror already holds them (fetched, coalesced, when it was opened).
- NVFP4 block scales, by default, a sample of each tensor: its first and last 64 bytes (`sample_windows`), read
  only where the bytes are on disk. That catches a tensor of NaN, negatives or zeros, and a zeroed tail (a
  download cut short into a preallocated file), for one or two page reads per tensor. A single bad block inside
  a tensor needs `--deep`. On the Hub every window would be a request of its own, so no sample is read there
  (and a Hub file cannot be half-downloaded: its sha256 is the Hub's).
- Block scales read whole: all of them under `--deep` (shards in parallel, a progress bar in bytes with its time
  estimate), and those of a module whose global scale could make a block scale overflow or round to 0 (or an
  NVFP4_AWQ layer's, checked against its pre_quant_scale): the value checks need every code, see codec/scale_values.py.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from repair.codec.scale_values import nvfp4_codes_needed_many
from repair.formats.modules import StoredModule
from repair.formats.nvfp4_health import SAMPLE_BYTES, BlockScaleStats, read_f32_scalar, sample_windows, stats_of
from repair.formats.nvfp4_packed import block_scale_shape
from repair.errors import BadInput
from repair.io.byte_source import LocalFiles, parallel_tensors
from repair.io.checkpoint import Checkpoint
from repair.io.ranges import RangeReader
from repair.io.safetensors import TensorInfo

SAMPLED, SCANNED, NOT_READ = "sampled", "scanned", "not read"
SCAN_CHUNK = 4 << 20  # bytes a local block-scale scan reads at a time (and checks while they are in the CPU's cache)
Progress = Callable[[int], AbstractContextManager]  # total bytes -> a bar with update(n) (the CLI passes io/progress.byte_bar)


@dataclass(frozen=True)
class ScaleScan:
    """Which scale values doctor read, and what that cost (its JSON `scale_checks`)."""

    block_scales: str  # SAMPLED, SCANNED or NOT_READ: how the NVFP4 block scales were checked
    tensors: int  # NVFP4 block-scale tensors with a checkable dtype and shape
    sampled: int  # of which a sample was read
    read_whole: int  # of which every byte was read
    total_bytes: int  # the block-scale tensors' bytes
    bytes_read: int  # of which read
    source: str  # "disk", or "the Hub"
    requests: int  # HTTP requests the block-scale reads cost (Hub only)
    scalars: int  # per-tensor scalars read (global, input and FP8 weight scales)
    sample_bytes: int = SAMPLE_BYTES  # per sample window: the first and the last this many bytes of each tensor

    def as_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str | None:
        """The one line the text report gives about block scales (None: the checkpoint has none)."""
        if not self.tensors:
            return None
        total = _size(self.total_bytes)
        if self.block_scales == SCANNED:
            cost = f", {self.requests:,} request(s)" if self.requests else ""
            return f"block scales scanned: every byte of {self.tensors:,} tensor(s), {total}{cost}"
        if self.block_scales == SAMPLED:
            how = f"sampled the first and last {self.sample_bytes} bytes of each of {self.sampled:,} tensor(s)"
        else:
            how = "on the Hub each sample would cost a request"
        whole = f"; {self.read_whole:,} read whole for the value checks" if self.read_whole else ""
        return f"block scales were not scanned ({how}{whole}); run with --deep to scan all {total}"


@dataclass(frozen=True)
class BlockRead:
    """What one read of a checkpoint's block scales found: the statistics by tensor name and what the read cost
    (ScaleScan's fields but `scalars`). The block scales are the checkpoint's, not a target's, so every target's
    diagnosis shares one read (`BlockReads`)."""

    stats: dict[str, BlockScaleStats]
    scan: dict[str, object]


BlockReads = dict[bool, BlockRead]  # deep -> the read, for one checkpoint: made by the first diagnosis, passed along to the next


class ScaleValues:
    """Scalar reads (called like a RangeReader) and the block-scale statistics, by tensor name, read up front (or taken
    from `shared`, where another target's diagnosis of the same checkpoint read them)."""

    def __init__(self, ckpt: Checkpoint, modules: dict[str, StoredModule], divisor: bool, deep: bool = False,
                 progress: Progress | None = None, shared: BlockReads | None = None):
        self._read = RangeReader()
        self._scalars = 0
        self._read.prefetch(i for i in ckpt.infos().values() if i.dtype == "F32" and i.nbytes == 4)  # the scalars, a run each
        shared = {} if shared is None else shared
        if deep not in shared:
            shared[deep] = self._read_blocks(ckpt, modules, divisor, deep, progress)
        self._block_read = shared[deep]

    def _read_blocks(self, ckpt: Checkpoint, modules: dict[str, StoredModule], divisor: bool, deep: bool,
                     progress: Progress | None) -> BlockRead:
        self._stats: dict[str, BlockScaleStats] = {}
        source = ckpt.byte_source or LocalFiles()
        blocks = _block_scales(ckpt, modules)
        suspects = self._needing_codes(ckpt, blocks, divisor)
        whole = [s for _, s in blocks if deep or s.name in suspects]
        sampled = self._sample(source, [s for _, s in blocks if not (deep or s.name in suspects)])
        before = source.transfer.requests
        read = self._read_whole(source, whole, suspects, progress if deep else None)
        return BlockRead(self._stats, dict(
            block_scales=SCANNED if deep else SAMPLED if sampled or not blocks else NOT_READ, tensors=len(blocks),
            sampled=len(sampled), read_whole=len(whole), total_bytes=sum(s.nbytes for _, s in blocks),
            bytes_read=read + sum(min(i.nbytes, 2 * SAMPLE_BYTES) for i in sampled),
            source="disk" if ckpt.byte_source is None else source.where, requests=source.transfer.requests - before))

    def __call__(self, path: Path, info: TensorInfo) -> bytes | bytearray:
        self._scalars += 1
        return self._read(path, info)

    def blocks(self, name: str) -> BlockScaleStats | None:
        """The statistics of a block-scale tensor (a sample's or every byte's), or None where none was read."""
        return self._block_read.stats.get(name)

    def report(self) -> ScaleScan:
        """What was read, once the checks have asked for their scalars."""
        return ScaleScan(**self._block_read.scan, scalars=self._scalars)

    def __enter__(self) -> "ScaleValues":
        return self

    def __exit__(self, *exc) -> None:
        self._read.__exit__(*exc)

    def _needing_codes(self, ckpt: Checkpoint, blocks: list[tuple[StoredModule, TensorInfo]], divisor: bool) -> set[str]:
        """The block-scale tensors the value checks need every code of (codec/scale_values.py): an NVFP4_AWQ layer's
        (its pre_quant_scale is checked against the peak), and those whose global scale could make some code overflow
        or round to 0, decided for every module at once."""
        infos = ckpt.infos()
        out, asked = set(), []
        for m, s in blocks:
            name = m.tensor("weight_scale_2")
            info = infos.get(name) if name else None
            if m.tensor("pre_quant_scale"):
                out.add(s.name)
            elif info is not None and info.dtype == "F32" and info.nbytes == 4:
                asked.append((s.name, read_f32_scalar(info.path, info, self._read)))
        needed = nvfp4_codes_needed_many([value for _, value in asked], divisor, "BF16")
        return out | {name for (name, _), need in zip(asked, needed) if need}

    def _sample(self, source, infos: list[TensorInfo]) -> list[TensorInfo]:
        """Sample each tensor whose windows are on disk; the ones sampled."""
        done = []
        for info in infos:
            windows = sample_windows(info)
            if all(source.holds(info.path, start, end) for start, end in windows):
                raw = b"".join(self._read.span(info.path, start, end, info.name) for start, end in windows)
                self._stats[info.name] = stats_of(raw, keep=False)
                done.append(info)
        return done

    def _read_whole(self, source, infos: list[TensorInfo], keep: set[str], progress: Progress | None) -> int:
        total = sum(i.nbytes for i in infos)
        local = isinstance(source, LocalFiles)  # scanned where they lie, shards in parallel; else as the source streams them
        with (progress or _no_bar)(total) as bar:
            for info, stats in parallel_tensors(infos, partial(_scan_shard, keep), os.cpu_count() or 1) if local else \
                    ((info, stats_of(raw, keep=info.name in keep)) for info, raw in source.tensors(infos)):
                self._stats[info.name] = stats
                if bar is not None:
                    bar.update(info.nbytes)
        return total


def _block_scales(ckpt: Checkpoint, modules: dict[str, StoredModule]) -> list[tuple[StoredModule, TensorInfo]]:
    """Each packed NVFP4 module's block-scale tensor, where its dtype and shape let it be checked (else the health
    check reports the shape, and reads nothing)."""
    infos = ckpt.infos()
    out = []
    for m in sorted(modules.values(), key=lambda m: m.name):
        name = m.tensor("weight_scale") if m.is_quantized and m.precision != "fp8" else None
        info = infos.get(name) if name else None
        if info is not None and info.dtype == "F8_E4M3" and info.shape == block_scale_shape(m.logical_shape):
            out.append((m, info))
    return out


def _scan_shard(keep: set[str], path: Path, infos: list[TensorInfo], emit) -> None:
    """Each block-scale tensor's statistics, read in file order through one reused buffer (memory: a chunk per
    worker, whatever the shard): a healthy chunk, every code in 0x01-0x7E, costs its copy and two numpy passes
    while it is still in the CPU's cache; a tensor with another code is counted byte by byte (stats_of)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    buffer = bytearray(SCAN_CHUNK)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        for info in infos:
            healthy = info.name not in keep and _healthy(fd, path, info, buffer)
            emit(info, BlockScaleStats(0, 0, 0, info.nbytes) if healthy else stats_of(_whole(fd, path, info), keep=info.name in keep))
    finally:
        os.close(fd)


def _healthy(fd: int, path: Path, info: TensorInfo, buffer: bytearray) -> bool:
    view = memoryview(buffer)
    for at in range(info.start, info.end, len(buffer)):
        got = os.preadv(fd, [view[:min(len(buffer), info.end - at)]], at)
        if got == 0:
            raise BadInput(f"{path}: {info.name}: file ended while reading; it is truncated, re-download it")
        codes = np.frombuffer(buffer, dtype=np.uint8, count=got)
        if got < min(len(buffer), info.end - at) or codes.min() < 1 or codes.max() > 0x7E:
            return False  # (a short read: _whole reads it again, to the end or to the error)
    return True


def _whole(fd: int, path: Path, info: TensorInfo) -> bytes:
    data = os.pread(fd, info.nbytes, info.start)
    if len(data) != info.nbytes:
        raise BadInput(f"{path}: {info.name}: file ended while reading; it is truncated, re-download it")
    return data


def _no_bar(total: int) -> AbstractContextManager:
    return nullcontext()


def _size(n: int) -> str:
    return f"{n:,} bytes" if n < 1000 else f"{n / 1e3:.1f} KB" if n < 1e6 else f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.1f} GB"
