"""Byte ranges of Hub files at a pinned commit, through huggingface_hub's own URL, auth headers, HTTP client and
retries (`hf_hub_url`, `build_hf_headers`, `http_stream_backoff`: 408, 429, 5xx, timeouts and resets, with backoff).

huggingface_hub's ranged reader (HfFileSystem) asks the Hub for the file's metadata on every open and every read;
here a range is one GET (two on the real Hub: its redirect and the CDN's answer). Ranges less than GAP apart are
read as one, a range is streamed in pieces (memory holds a piece, not the range) and resumed where a connection
broke, and `client.map_threads` keeps a few files in flight at once. `RemoteBytes` is a Hub checkpoint's
`byte_source`: what its sparse mirror holds, and every other byte on request.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from repair.errors import BadInput
from repair.hub import client
from repair.hub.errors import hub_call
from repair.io.byte_source import Emit, Transfer, parallel_tensors
from repair.io.safetensors import TensorInfo

PIECE = 1 << 20  # bytes handed on at a time from a streamed range
GAP = 64 << 10  # ranges closer than this are fetched as one (the gap's bytes cost less than another round trip)
RESUMES = 5  # a range whose connection breaks mid-stream is asked again from where it stopped, this many times


class RangeClient:
    """GETs of byte ranges of one repo at one commit, counted (requests as the server sees them, and bytes)."""

    def __init__(self, repo: str, sha: str, label: str):
        self.repo, self.sha, self.label = repo, sha, label
        self.transfer = Transfer()
        self._lock = threading.Lock()

    def stream(self, name: str, start: int, end: int, sink: Callable[[int, bytes], None]) -> None:
        """sink(offset, piece) over exactly [start, end) of `name`, in order."""
        from huggingface_hub import hf_hub_url
        from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff

        url = hf_hub_url(self.repo, name, revision=self.sha, endpoint=client.endpoint())
        at, broken = start, 0
        while at < end:
            try:
                headers = {**build_hf_headers(), "Range": f"bytes={at}-{end - 1}"}
                with http_stream_backoff("GET", url, headers=headers) as response:
                    self._count(len(response.history) + 1, 0)
                    hf_raise_for_status(response)
                    _check_range(response, at, self.label, name)
                    for piece in response.iter_bytes(PIECE):
                        piece = piece[: end - at]
                        sink(at, piece)
                        at += len(piece)
                        self._count(0, len(piece))
                        if at >= end:
                            break
                    if at < end:
                        raise EOFError(f"{name}: the answer ended at byte {at} of {end}")
            except (EOFError, *_transient()):
                broken += 1
                if broken > RESUMES:
                    raise

    def read(self, name: str, start: int, end: int) -> bytes:
        """A small range, in memory."""
        out = bytearray()
        self.stream(name, start, end, lambda _, piece: out.extend(piece))
        return bytes(out)

    def _count(self, requests: int, nbytes: int) -> None:
        with self._lock:
            self.transfer.add(requests, nbytes)


def _transient() -> tuple[type[Exception], ...]:
    """The broken-connection errors huggingface_hub itself retries (timeouts, network errors, protocol errors)."""
    from huggingface_hub.utils import _http

    return tuple(getattr(_http, "_DEFAULT_RETRY_ON_EXCEPTIONS", (OSError,)))


def _check_range(response, at: int, label: str, name: str) -> None:
    """A 206 starting at `at` (a 200 is the whole file: usable only from its start)."""
    got = response.headers.get("Content-Range", "")
    if response.status_code == 206 and got.startswith(f"bytes {at}-"):
        return
    if response.status_code == 200 and at == 0:
        return
    raise BadInput(f"{label}/{name}: the server answered a range request with HTTP {response.status_code} "
                   f"({got or 'no Content-Range'}); re-run, or use a local copy")


def coalesce(ranges: list[tuple[int, int]], gap: int = GAP) -> list[tuple[int, int]]:
    """Sorted ranges with those less than `gap` apart merged."""
    out: list[tuple[int, int]] = []
    for start, end in sorted(ranges):
        if out and start - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


class RemoteBytes:
    """A Hub checkpoint's byte source: the ranges its local stand-ins hold, and the rest fetched on request."""

    where = "the Hub"

    def __init__(self, ranges: RangeClient, names: Callable[[Path], str | None]):
        self.client, self._name = ranges, names  # names: a local stand-in's path -> its file name in the repo
        self.transfer = ranges.transfer
        self._held: dict[str, list[tuple[int, int]]] = {}
        self._whole: set[str] = set()
        self._lock = threading.Lock()

    def hold(self, path: Path, ranges: list[tuple[int, int]], whole: bool = False) -> None:
        """Record that `path` now holds these ranges (or, `whole`, every byte). Kept by file name: one source's
        stand-ins are the repo's top-level shards, one folder (whatever links its path went through)."""
        key = Path(path).name
        with self._lock:
            if whole:
                self._whole.add(key)
            self._held[key] = coalesce(self._held.get(key, []) + list(ranges), 0)

    def holds(self, path: Path, start: int, end: int) -> bool:
        key = Path(path).name
        return key in self._whole or any(s <= start and end <= e for s, e in self._held.get(key, []))

    def held(self, path: Path) -> list[tuple[int, int]]:
        return list(self._held.get(Path(path).name, []))

    def tensors(self, infos: list[TensorInfo]) -> Iterator[tuple[TensorInfo, bytes]]:
        return parallel_tensors(infos, self._read_shard, client.WORKERS)

    def store(self, infos: list[TensorInfo], gap: int = GAP) -> bool:
        """Fetch these tensors' bytes into their stand-ins (coalesced, a few files at a time); True if any were."""
        jobs: dict[Path, list[tuple[int, int]]] = {}
        for info in infos:
            if info.nbytes and not self.holds(info.path, info.start, info.end):
                jobs.setdefault(info.path, []).append((info.start, info.end))
        client.map_threads(lambda job: self._store_file(*job), [(p, coalesce(r, gap)) for p, r in jobs.items()])
        return bool(jobs)

    def _store_file(self, path: Path, ranges: list[tuple[int, int]]) -> None:
        name = self._name(path)
        with hub_call(f"{self.client.label}/{name}"), open(path, "r+b") as fh:
            for start, end in ranges:
                self.client.stream(name, start, end, lambda at, piece: os.pwrite(fh.fileno(), piece, at))
                self.hold(path, [(start, end)])

    def _read_shard(self, path: Path, infos: list[TensorInfo], emit: Emit) -> None:
        """Each tensor's bytes, cut from coalesced streamed ranges (or read from the stand-in where it holds them)."""
        name = self._name(path)
        local = [i for i in infos if self.holds(path, i.start, i.end)]
        remote = [i for i in infos if not self.holds(path, i.start, i.end)]
        with open(path, "rb") as fh:
            for info in local:
                emit(info, os.pread(fh.fileno(), info.nbytes, info.start))
        for start, end in coalesce([(i.start, i.end) for i in remote]):
            with hub_call(f"{self.client.label}/{name}"):
                self.client.stream(name, start, end, _Cutter([i for i in remote if start <= i.start and i.end <= end], emit))


class _Cutter:
    """A streamed range cut back into the tensors it covers (gaps between them skipped), each emitted whole."""

    def __init__(self, infos: list[TensorInfo], emit: Emit):
        self.infos, self.emit, self.buf = iter(infos), emit, bytearray()
        self.info = next(self.infos, None)

    def __call__(self, at: int, piece: bytes) -> None:
        view = memoryview(piece)
        while len(view) and self.info is not None:
            if at < self.info.start:
                skip = min(self.info.start - at, len(view))
                view, at = view[skip:], at + skip
                continue
            take = min(self.info.end - at, len(view))
            self.buf += view[:take]
            view, at = view[take:], at + take
            if at >= self.info.end:
                self.emit(self.info, bytes(self.buf))
                self.info, self.buf = next(self.infos, None), bytearray()
