"""Upload routes: preupload, the git-LFS batch API, pre-signed LFS upload targets, and the NDJSON commit.

Flow the real client follows (Xet disabled)::

    POST /api/models/{repo}/preupload/{rev}          -> uploadMode lfs|regular, shouldIgnore, remote oid
    POST /{repo}.git/info/lfs/objects/batch          -> per object: no "actions" if stored, else upload href
    PUT  /__lfs/upload/{oid}?sig=...                 (single part; no auth header, the href is pre-signed)
    PUT  /__lfs/part/{oid}/{n}?sig=... + POST /__lfs/complete/{oid}?sig=...   (multipart)
    POST /__lfs/verify/{oid}                         (with the token)
    POST /api/models/{repo}/commit/{rev}[?create_pr=1]   NDJSON: header, file, lfsFile, deletedFile, deletedFolder

A commit is applied atomically under the store lock only after its whole body was read and checked, so an
upload that fails midway never moves a branch. Objects are content-addressed and kept even if unused.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import shutil

from . import discussions, gitobj
from .errors import HubError
from .routes_read import load_repo, resolve, snapshot, take_rev


def preupload(h, repo_id: str, segs: list[str]) -> None:
    rev, _ = take_rev(segs)
    h.require_auth()
    body = h.read_json()
    _, sha, table = snapshot(h, repo_id, rev, write=_level(h, rev))
    patterns = gitobj.lfs_patterns(h.store.text_at(table, ".gitattributes"))
    gitignore = body["gitIgnore"] if isinstance(body.get("gitIgnore"), str) else h.store.text_at(table, ".gitignore")
    files = []
    for item in body.get("files", []):
        path, size = item.get("path", ""), item.get("size", 0)
        if not isinstance(size, int) or not isinstance(path, str):
            raise HubError(400, "preupload files need a string path and an integer size")
        lfs = gitobj.wants_lfs(path, size, gitobj.b64decode(item.get("sample", "")), patterns)
        existing = table.get(path)
        oid = None if existing is None else (existing["sha256"] if existing["lfs"] else existing["oid"])
        files.append({"path": path, "uploadMode": "lfs" if lfs else "regular",
                      "shouldIgnore": gitobj.is_ignored(path, gitignore), "oid": oid})
    h.send_json(200, {"files": files, "commitOid": sha})


def _level(h, rev: str) -> str:
    """A commit that opens or extends a pull request proposes; any other changes the repo."""
    return "propose" if h.query_flag("create_pr") or rev.startswith("refs/pr/") else "write"


def lfs_batch(h, repo_id: str) -> None:
    h.require_auth()
    body = h.read_json()
    with h.store.lock:
        load_repo(h, repo_id, write="propose")  # a PR's LFS files too; the commit decides where they go
    if body.get("operation") != "upload":
        raise HubError(400, "LocalHub only implements the LFS 'upload' operation")
    objects = []
    for obj in body.get("objects", []):
        oid, size = str(obj.get("oid", "")).lower(), obj.get("size")
        if not gitobj.is_hex(oid, (64,)) or not isinstance(size, int) or size < 0:
            objects.append({"oid": str(obj.get("oid", "")), "size": size if isinstance(size, int) else 0,
                            "error": {"code": 422, "message": "Invalid oid or size"}})
        elif h.store.object_size(oid) == size:
            objects.append({"oid": oid, "size": size})  # already stored: the client skips the upload
        else:
            objects.append({"oid": oid, "size": size, "authenticated": True, "actions": _actions(h, oid, size)})
    h.send_json(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")


def _actions(h, oid: str, size: int) -> dict:
    hub = h.hub
    sig = secrets.token_hex(16)
    parts = math.ceil(size / hub.multipart_chunk_size) if size > hub.multipart_threshold else 0
    with hub._lock:
        hub._uploads[sig] = {"oid": oid, "size": size, "parts": parts}
    base = f"{hub.endpoint}/__lfs"
    verify = {"href": f"{base}/verify/{oid}", "header": {}}
    if not parts:
        return {"upload": {"href": f"{base}/upload/{oid}?sig={sig}"}, "verify": verify}
    header = {"chunk_size": str(hub.multipart_chunk_size)}
    header.update({str(i): f"{base}/part/{oid}/{i}?sig={sig}" for i in range(1, parts + 1)})
    return {"upload": {"href": f"{base}/complete/{oid}?sig={sig}", "header": header}, "verify": verify}


def _signed(h, oid: str) -> tuple[str, dict]:
    sig = h.query_value("sig", "")
    with h.hub._lock:
        upload = h.hub._uploads.get(sig)
    if upload is None or upload["oid"] != oid:
        raise HubError(403, "Invalid or expired upload signature")
    return sig, upload


def _receive(h, dest) -> tuple[int, str, str]:
    """Stream the request body into ``dest``: (size, sha256, md5). Honours fault injection."""
    sha, md5, size = hashlib.sha256(), hashlib.md5(), 0
    with open(dest, "wb") as f:
        for block in h.iter_body():
            f.write(block)
            sha.update(block)
            md5.update(block)
            size += len(block)
    return size, sha.hexdigest(), md5.hexdigest()


def lfs_target(h, segs: list[str]) -> None:
    """The pre-signed endpoints handed out by the batch API (plus verify)."""
    kind = segs[0] if segs else ""
    if kind == "upload" and len(segs) == 2 and h.method == "PUT":
        oid = segs[1]
        _, upload = _signed(h, oid)
        h.arm_upload_fault()
        tmp = h.store.new_tmp_path("lfs")
        try:
            size, sha, _ = _receive(h, tmp)
            if size != upload["size"] or sha != oid:
                raise HubError(400, f"Uploaded content does not match oid/size (got {sha}, {size} bytes)")
            h.store.adopt(tmp, oid)
        finally:
            tmp.unlink(missing_ok=True)
        h.send_bytes(200, b"", {"ETag": f'"{oid}"'})
    elif kind == "part" and len(segs) == 3 and h.method == "PUT":
        oid, number = segs[1], int(segs[2]) if segs[2].isdigit() else 0
        sig, upload = _signed(h, oid)
        if not 1 <= number <= upload["parts"]:
            raise HubError(400, f"Invalid part number {segs[2]}")
        h.arm_upload_fault()
        folder = h.store.tmp_dir / f"parts-{sig}"
        folder.mkdir(exist_ok=True)
        tmp = h.store.new_tmp_path("part")
        try:
            _, _, md5 = _receive(h, tmp)
            tmp.replace(folder / str(number))
        finally:
            tmp.unlink(missing_ok=True)
        h.send_bytes(200, b"", {"ETag": f'"{md5}"'})
    elif kind == "complete" and len(segs) == 2 and h.method == "POST":
        _complete_multipart(h, segs[1])
    elif kind == "verify" and len(segs) == 2 and h.method == "POST":
        h.require_auth()
        body = h.read_json()
        if h.store.object_size(segs[1]) != body.get("size"):
            raise HubError(404, f"LFS object {segs[1]} not found")
        h.send_json(200, {"success": True})
    else:
        raise HubError(404, "Not found")


def _complete_multipart(h, oid: str) -> None:
    sig, upload = _signed(h, oid)
    body = h.read_json()
    folder = h.store.tmp_dir / f"parts-{sig}"
    parts = sorted(body.get("parts", []), key=lambda p: p.get("partNumber", 0))
    if [p.get("partNumber") for p in parts] != list(range(1, upload["parts"] + 1)):
        raise HubError(400, "Completion payload does not list every part")
    tmp = h.store.new_tmp_path("assembled")
    sha, size = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                path = folder / str(part["partNumber"])
                if not path.is_file():
                    raise HubError(400, f"Part {part['partNumber']} was never uploaded")
                data = path.read_bytes()
                if hashlib.md5(data).hexdigest() != str(part.get("etag", "")).strip('"'):
                    raise HubError(400, f"ETag mismatch for part {part['partNumber']}")
                out.write(data)
                sha.update(data)
                size += len(data)
        if size != upload["size"] or sha.hexdigest() != oid:
            raise HubError(400, "Assembled content does not match oid/size")
        h.store.adopt(tmp, oid)
        shutil.rmtree(folder, ignore_errors=True)
    finally:
        tmp.unlink(missing_ok=True)
    h.send_json(200, {})


def _parse_commit(h, body: bytes) -> tuple[dict, list[tuple]]:
    header, ops = None, []
    for line in body.splitlines():
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError:
            raise HubError(400, "Commit payload must be NDJSON") from None
        key, value = item.get("key"), item.get("value") or {}
        if key == "header":
            header = value
            continue
        path = value.get("path")
        if not isinstance(path, str) or not path:
            raise HubError(400, f"Commit operation {key!r} without a path")
        if key == "file":
            content = value.get("content", "")
            data = gitobj.b64decode(content) if value.get("encoding", "base64") == "base64" else content.encode()
            ops.append(("add", path, h.store.entry_for_bytes(data, lfs=False)))
        elif key == "lfsFile":
            oid = str(value.get("oid", "")).lower()
            size = h.store.object_size(oid)
            if size is None or value.get("size") not in (None, size):
                raise HubError(400, f"LFS object {oid} for {path!r} has not been uploaded (or has another size)")
            ops.append(("add", path, h.store.entry_for_lfs_object(oid, size)))
        elif key in ("deletedFile", "deletedFolder"):
            ops.append(("delete" if key == "deletedFile" else "delete_folder", path))
        else:
            raise HubError(400, f"Unknown commit operation {key!r}")
    if header is None or not str(header.get("summary", "")).strip():
        raise HubError(400, "Commit header with a non-empty summary is required")
    return header, ops


def commit(h, repo_id: str, segs: list[str]) -> None:
    rev, _ = take_rev(segs)
    user = h.require_auth()
    create_pr = h.query_flag("create_pr")
    h.arm_upload_fault()
    header, ops = _parse_commit(h, h.read_body())
    summary, description = str(header["summary"]).strip(), str(header.get("description") or "")
    parent = str(header["parentCommit"]).lower() if header.get("parentCommit") else None
    store, pr_url = h.store, None
    with store.lock:
        repo = load_repo(h, repo_id, write=_level(h, rev))
        head, ref = resolve(h, repo, rev)
        if ref is None or not ref.startswith(("refs/heads/", "refs/pr/")):
            raise HubError(400, f"Cannot commit to {rev!r}: not a branch or pull request ref")
        if create_pr:
            if not ref.startswith("refs/heads/"):
                raise HubError(400, "create_pr needs a branch as revision")
            base = head
            if parent:
                hit = store.resolve(repo, parent)
                if hit is None:
                    raise HubError(404, f"Parent commit {parent} not found", "RevisionNotFound")
                base = hit[0]
            tree = store.apply_ops(store.tree(repo, base), ops, base)
            new = store.add_commit(repo, parents=[base], tree=tree, title=summary, message=description, author=user)
            disc = discussions.create(repo, title=summary, description=description or summary, author=user,
                                      is_pr=True, base_commit=base, base_ref=ref, status="open")
            repo["refs"][f"refs/pr/{disc['num']}"] = new
            discussions.add_commit(disc, user, new, summary)
            pr_url = f"{h.hub.endpoint}/{repo_id}/discussions/{disc['num']}"
        else:
            if parent and not head.startswith(parent):
                raise HubError(412, "A commit has happened since. Please refresh and try again.")
            disc = discussions.find(repo, int(ref.rsplit("/", 1)[1])) if ref.startswith("refs/pr/") else None
            if disc is not None and disc["status"] == "merged":
                raise HubError(400, "Cannot commit to a merged pull request")
            tree = store.apply_ops(store.tree(repo, head), ops, head)
            new = store.add_commit(repo, parents=[head], tree=tree, title=summary, message=description, author=user)
            repo["refs"][ref] = new
            if disc is not None:
                discussions.add_commit(disc, user, new, summary)
        store.save(repo)
    h.send_json(200, {"success": True, "commitOid": new, "commitUrl": f"{h.hub.endpoint}/{repo_id}/commit/{new}",
                      "pullRequestUrl": pr_url, "hookOutput": ""})
