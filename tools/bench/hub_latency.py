"""The local Hub server as the real Hub costs: a fixed delay on every request, and a shard GET answered with a
redirect that the client follows to where the bytes are (as the Hub sends LFS files to its CDN), so a ranged read
costs two requests. And a repo registered from a folder of sparse files without reading them."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from tools.hub_server import LocalHub

CDN = "cdn=1"


class SlowHub(LocalHub):
    """LocalHub with `latency` seconds added to every request and CDN redirects for .safetensors GETs."""

    latency = 0.03

    def _dispatch(self, h) -> None:
        time.sleep(self.latency)
        s = h.segs
        if h.method == "GET" and len(s) >= 4 and s[2] == "resolve" and s[-1].endswith(".safetensors") and CDN not in h.raw_query:
            return h.send_bytes(302, b"", {"Location": h.path.partition("?")[0] + "?" + CDN}, length=0)
        return super()._dispatch(h)


def add_sparse_repo(hub: LocalHub, repo_id: str, folder: Path) -> str:
    """A repo of `folder`'s files where each shard is hard-linked into the store under a stand-in id (hashing
    412 GB of holes would take minutes; ranged reads never check a whole file's sha256). Small files as usual."""
    tree = {}
    for path in sorted(p for p in folder.iterdir() if p.is_file()):
        if path.suffix != ".safetensors":
            tree[path.name] = hub.store.entry_for_bytes(path.read_bytes(), lfs=False)
            continue
        size = path.stat().st_size
        sha = hashlib.sha256(f"{repo_id}/{path.name}:{size}".encode()).hexdigest()
        dest = hub.store.object_path(sha)
        dest.parent.mkdir(parents=True, exist_ok=True)
        if not dest.exists():
            os.link(path, dest)
        tree[path.name] = hub.store.entry_for_lfs_object(sha, size)
    with hub.store.lock:
        repo = hub.store.create(repo_id, private=False, author=hub.user, tree=tree, title="initial")
    return repo["refs"]["refs/heads/main"]


def served(hub: LocalHub, sizes: dict[str, int]) -> dict:
    """Requests and file bytes the server answered (a redirect and its CDN GET count as two)."""
    requests = hub.requests
    nbytes = 0
    for r in requests:
        name = r.path.rsplit("/", 1)[-1]
        if r.method != "GET" or "/resolve/" not in r.path or r.status not in (200, 206):
            continue
        if r.range:
            start, end = r.range.removeprefix("bytes=").split("-")
            nbytes += min(int(end) + 1, sizes.get(name, 0)) - int(start)
        else:
            nbytes += sizes.get(name, 0)
    shard_requests = sum(1 for r in requests if r.path.endswith(".safetensors"))
    return {"requests": len(requests), "shard_requests": shard_requests, "other_requests": len(requests) - shard_requests,
            "bytes": nbytes}
