"""Every file taken whole from the Hub is checked against what the pinned listing says of it, before use.

An LFS file against its sha256 (the LFS oid), a regular (small, non-LFS) file against its git blob id
(sha1 of `blob <size>\\0` + bytes), and both against their size. Byte ranges (the shards' headers and
scale tensors, read by inspect, doctor and planning) cannot be checked against a whole-file hash:
they are taken as served, and the whole file is verified wherever it is used to build output.
The check reads the file through the handle it is pinned by (io/pins.py), and every later read uses
that handle: a download changed in the work folder or the cache after its check is caught before publishing.
A copy that fails is removed (from the work folder, or from huggingface_hub's cache, so a re-run
fetches it again) and the run stops with one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from repair.errors import BadInput
from repair.hub.remote import RemoteRepo
from repair.io.pins import PinnedFile, Pins, changed_input

CHUNK = 16 << 20
SMALL = 64 << 20  # a regular (non-LFS) file is hashed from its bytes read whole, kept for its readers


def verified(repo: RemoteRepo, name: str, path: Path, cache: Path | None = None, pins: Pins | None = None) -> PinnedFile:
    """The download of `name` at the pinned commit, opened once (into `pins` when given) and hashed through that
    handle: the bytes hashed are the bytes every later read gets (io/pins.py), and a change after this check is a
    change of the pinned file's identity, caught before publishing. Else BadInput, and the copy is removed.
    `cache`: huggingface_hub's cache folder the file was downloaded into (its damaged blob is removed too)."""
    remote = repo.files[name]
    if not (remote.sha256 or remote.blob_id):
        raise BadInput(f"{repo.label}/{name}: the Hub's listing gives no hash for this file, so its download cannot be "
                       "verified; nothing was written (is HF_ENDPOINT a Hub?)")
    pinned = pins.pin(path) if pins is not None else PinnedFile(path)
    try:
        return _checked(repo, name, pinned, cache)
    except EOFError:  # it got shorter while it was hashed: another program is writing to it
        pinned.close()
        raise changed_input(path) from None


def _checked(repo: RemoteRepo, name: str, pinned: PinnedFile, cache: Path | None) -> PinnedFile:
    remote, path = repo.files[name], pinned.path
    if remote.sha256:
        kind, want = "LFS sha256", remote.sha256
        got = _digest(pinned, hashlib.sha256()) if pinned.size == remote.size else f"{pinned.size:,} bytes"
    else:
        kind, want = "git blob id", remote.blob_id
        got = hashlib.sha1(b"blob %d\0" % pinned.size + pinned.read_all()).hexdigest() if pinned.size <= SMALL else f"{pinned.size:,} bytes"
    if got == want.lower() and pinned.size == remote.size:
        return pinned
    pinned.close()  # the run stops here: its table is not checked again
    _remove(path, cache)
    raise BadInput(f"{repo.label}/{name}: the downloaded bytes do not match the Hub's {kind} ({got[:12]}... is not "
                   f"{want[:12]}...); nothing was written, re-run (if it repeats, the repo's storage is damaged)")


def _digest(pinned: PinnedFile, digest) -> str:
    for start in range(0, pinned.size, CHUNK):
        digest.update(pinned.read(start, min(CHUNK, pinned.size - start)))
    return digest.hexdigest()


def _remove(path: Path, cache: Path | None) -> None:
    """The damaged copy: the file (a snapshot link) and, in huggingface_hub's cache, the blob it points to,
    which a re-run would otherwise take as downloaded (only a blob inside that cache is removed)."""
    try:
        blob = path.resolve()
        if cache is not None and path.is_symlink() and blob.is_relative_to(Path(cache).resolve()):
            blob.unlink(missing_ok=True)
        path.unlink(missing_ok=True)
    except OSError:
        pass
