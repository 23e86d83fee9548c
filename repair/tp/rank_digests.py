"""The sha256 of every rank file `unshard` reads, from the reads that rebuild the checkpoint: each byte read once.

A rank file's header is hashed as it is parsed; its tensor bytes as the rebuild copies or reads them
(io/hashing.SourceDigest), and the bytes no rebuild reads (a replicated tensor's copy on ranks past 0) through
the same pinned handle as the digest passes them. Rank 0's small files are hashed by their whole copies, the other
ranks' read only to be hashed. All are compared with tp_manifest.json at the end, before anything is published.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from repair.errors import BadInput
from repair.execute.copies import AHEAD as COPIES_AHEAD
from repair.io.hasher import AHEAD, SharedHashers, shared_threads
from repair.io.hashing import SourceDigest, sha256_pinned
from repair.io.pins import PinnedFile, open_files_allowed
from repair.io.dtypes import nbytes
from repair.io.safetensors import MAX_HEADER_BYTES, TensorInfo, read_header
from repair.io.staging import InterruptGate
from repair.tp.manifest import MANIFEST, RANK_FILE, Manifest


@dataclass(frozen=True)
class RankFile:
    """One rank's tensor file: its pinned handle, its tensors, and the sha256 of its header bytes as parsed."""

    file: PinnedFile
    tensors: dict[str, TensorInfo]
    head: "hashlib._Hash"  # sha256 fed bytes [0, data_start): the whole file's digest continues from a copy of it
    data_start: int


class _HashedReads:
    """A pinned file as read_header reads it (its size, `read_into`): the bytes read from offset 0 on are hashed as
    they pass, so the header is never read again for its digest."""

    def __init__(self, pinned: PinnedFile):
        self.pinned, self.size, self.digest, self.at = pinned, pinned.size, hashlib.sha256(), 0

    def read_into(self, offset: int, view: memoryview) -> int:
        got = self.pinned.read_into(offset, view)
        if offset == self.at:
            self.digest.update(view[:got])
            self.at += got
        return got


def read_rank(path: Path, pinned: PinnedFile, digest: str, most: Callable[[], int]) -> RankFile:
    """A rank file's header, hashed as read; a header that does not parse is named as damaged when the file's sha256
    differs from the manifest (the cause), else by what is wrong with it. `most`: `largest_rank_file`'s, on failure."""
    reads = _HashedReads(pinned)
    try:
        header = read_header(path, reads)  # type: ignore[arg-type]  # a PinnedFile's size and read_into
    except BadInput:
        refuse_if_changed(pinned, digest, most)
        raise
    return RankFile(pinned, header.by_name(), reads.digest, reads.at)


def largest_rank_file(manifest: Manifest, rank: int) -> int:
    """The most bytes rank `rank`'s tensor file can hold: the largest header and the manifest's slices for that rank."""
    return 8 + MAX_HEADER_BYTES + sum(nbytes(t["dtype"], tuple(t["ranks"][rank]["shape"])) for t in manifest.tensors.values())


def refuse_if_changed(pinned: PinnedFile, digest: str, most: Callable[[], int]) -> None:
    """After a rank file disagreed with the manifest: the one line saying it is not the file `fix --tp` wrote, when
    its sha256 shows that (the file is read again: this is the failure path). A file larger than `most()` is refused by
    its size: a sparse terabyte is never read through to say so."""
    if pinned.size > most():
        raise BadInput(f"{pinned.path}: {pinned.size} bytes, more than {MANIFEST}'s tensors for it and a header can fill; "
                       "the file was changed or damaged, re-run `fix --tp`")
    if _sha256(pinned) != digest:
        raise differs(pinned.path)


def differs(path: Path) -> BadInput:
    return BadInput(f"{path}: sha256 differs from {MANIFEST}; the file was changed or damaged, re-run `fix --tp`")


class RankDigests:
    """Each rank file's digest, fed by the rebuild's reads (`of(rank)`); `check` compares every rank file with the
    manifest. The digests share one hashing thread per core at most (tp comes from a shared manifest: no tp may ask
    for thousands of threads), started with signals held and stopped when `with` ends, whatever ends it."""

    def __init__(self, manifest: Manifest, ranks: list[RankFile], gate: InterruptGate):
        self._manifest, self._ranks = manifest, ranks
        self._hashers = SharedHashers(len(ranks), gate.held)
        self._digests: list[SourceDigest] = []

    def __enter__(self) -> "RankDigests":
        self._hashers.__enter__()
        self._digests = [SourceDigest(rank.file, rank.head.copy(), rank.data_start, self._hashers.of(r)) for r, rank in enumerate(self._ranks)]
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.abort()

    def of(self, rank: int) -> SourceDigest:
        return self._digests[rank]

    def check(self, pins, copied: dict[str, str]) -> None:
        """Every rank file's sha256 is the manifest's, or the one line naming the first that is not. `copied`: rank 0's
        small files' digests, of the bytes their copies read; every other small file is read here to be hashed."""
        for number, rank in enumerate(self._manifest.ranks):
            for name, (path, digest) in rank.files.items():
                if name == RANK_FILE:
                    found = self._finished(number, pins)
                else:
                    found = copied[name] if number == 0 and name in copied else _sha256(pins.get(path))
                if found != digest:
                    raise differs(path)

    def _finished(self, number: int, pins) -> str:
        """Rank `number`'s sha256. A file that ended early may be another rank's (a shared thread raises the first error
        of any digest it feeds): the pins name the file that changed, else the error does (it names its file)."""
        try:
            return self._digests[number].hexdigest()
        except EOFError as ended:
            pins.check("SRC")
            raise BadInput(f"{ended}; the file was truncated, re-run `fix --tp`") from None

    def abort(self) -> None:
        """Stops every hashing thread (after the jobs it holds): before the temp folder goes, or at the end."""
        self._hashers.stop()


def _sha256(pinned: PinnedFile) -> str:
    return _whole(pinned, lambda: sha256_pinned(pinned))


def _whole(pinned: PinnedFile, digest: Callable[[], str]) -> str:
    """A digest finished by reading the rest of its file: a file that ends first was truncated (one line)."""
    try:
        return digest()
    except EOFError:
        raise BadInput(f"{pinned.path}: file ended while reading; it was truncated, re-run `fix --tp`") from None


SPARE_FILES = 64  # files open beside the rank files and input shards: the output shard, the report, Python's own


def open_files_needed(files: int, tp: int) -> int:
    """Files a `fix --tp` or `unshard` run holds at once: `files` of its own, a few spare, and the copied chunks each
    hashing thread (the ranks', an input's, the small files' copies') may hold awaiting their hash: each a mapping of
    its output, and CPython's mmap holds a file descriptor of its own."""
    return files + SPARE_FILES + (shared_threads(tp) + 1 + COPIES_AHEAD) * AHEAD


def check_open_files(files: int, tp: int, src: Path) -> None:
    """unshard pins every rank file at once: past what this process may open, one line before anything is opened."""
    needed = open_files_needed(files, tp)
    allowed = open_files_allowed(needed)
    if allowed < needed:
        raise BadInput(f"{src}: unshard keeps the {files} rank files of {tp} rank(s) open at once, {needed} files with "
                       f"its own, and this process may open {allowed} (ulimit -n, hard limit); raise it, then re-run")
