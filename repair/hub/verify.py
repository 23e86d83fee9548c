"""Every file taken whole from the Hub is checked against what the pinned listing says of it, before use.

An LFS file against its sha256 (the LFS oid), a regular (small, non-LFS) file against its git blob id
(sha1 of `blob <size>\\0` + bytes), and both against their size. Byte ranges (the shards' headers and
scale tensors, read by inspect, doctor and planning) cannot be checked against a whole-file hash:
they are taken as served, and the whole file is verified wherever it is used to build output.
A copy that fails is removed (from the work folder, or from huggingface_hub's cache, so a re-run
fetches it again) and the run stops with one line.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from repair.errors import BadInput
from repair.hub.remote import RemoteRepo

CHUNK = 16 << 20


def verified(repo: RemoteRepo, name: str, path: Path, cache: Path | None = None) -> Path:
    """`path`, the download of `name` at the pinned commit, once its bytes match the listing; else BadInput.
    `cache`: huggingface_hub's cache folder the file was downloaded into (its damaged blob is removed too)."""
    remote = repo.files[name]
    if remote.sha256:
        kind, want, got = "LFS sha256", remote.sha256, _digest(path, hashlib.sha256())
    elif remote.blob_id:
        kind, want = "git blob id", remote.blob_id
        got = _digest(path, hashlib.sha1(b"blob %d\0" % path.stat().st_size))
    else:
        raise BadInput(f"{repo.label}/{name}: the Hub's listing gives no hash for this file, so its download cannot be "
                       "verified; nothing was written (is HF_ENDPOINT a Hub?)")
    if got == want.lower() and path.stat().st_size == remote.size:
        return path
    _remove(path, cache)
    raise BadInput(f"{repo.label}/{name}: the downloaded bytes do not match the Hub's {kind} ({got[:12]}... is not "
                   f"{want[:12]}...); nothing was written, re-run (if it repeats, the repo's storage is damaged)")


def _digest(path: Path, digest) -> str:
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
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
