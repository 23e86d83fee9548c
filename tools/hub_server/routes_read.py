"""Read-only routes: repo info, tree, paths-info, refs, commits, file resolve (HEAD/GET with Range)."""

from __future__ import annotations

import json
import re
import struct
from urllib.parse import quote, urlencode

from . import access, cardmeta, gitobj
from .errors import HubError, entry_not_found, repo_not_found, revision_not_found
from .store import Store

STREAM_CHUNK = 1 << 20
SECURITY_OK = {"status": "safe", "avScan": {"virusFound": False, "virusNames": None}, "pickleImportScan": None}


# ------------------------------------------------------------------ helpers
def take_rev(segs: list[str]) -> tuple[str, list[str]]:
    """Split ``[rev, *rest]``; an unquoted ``refs/pr/1`` spread over three segments is joined back."""
    if not segs or not segs[0]:
        raise HubError(400, "Missing revision")
    if segs[0] == "refs" and len(segs) >= 3 and segs[1] in ("heads", "tags", "pr", "convert"):
        return "/".join(segs[:3]), segs[3:]
    return segs[0], segs[1:]


def load_repo(h, repo_id: str, *, write: str | None = None) -> dict:
    """The repo, or 404 RepoNotFound / 401 (private repo without a valid token, or a write without one) /
    403 (the token may not `write` there: "write" changes content, "propose" opens a PR; see access.py)."""
    if write:
        h.require_auth()
    repo = h.store.get(repo_id)
    if repo is None:
        raise repo_not_found(repo_id)
    if repo["private"] and (h.auth_state() != "ok" or not access.may_see_private(h, repo_id)):
        raise repo_not_found(repo_id, status=401)
    if write:
        access.require(h, repo_id, write)
    return repo


def resolve(h, repo: dict, rev: str) -> tuple[str, str | None]:
    hit = h.store.resolve(repo, rev)
    if hit is None:
        raise revision_not_found(rev)
    return hit


def snapshot(h, repo_id: str, rev: str, *, write: str | None = None) -> tuple[dict, str, dict]:
    """(repo, commit sha, file table) under the store lock. File tables are never mutated in place."""
    with h.store.lock:
        repo = load_repo(h, repo_id, write=write)
        sha, _ = resolve(h, repo, rev)
        return repo, sha, h.store.tree(repo, sha)


def _last_commit(h, repo: dict, sha: str, path: str, is_dir: bool) -> dict:
    with h.store.lock:
        commit = h.store.last_change(repo, sha, path, is_dir)
    return {"id": commit["id"], "title": commit["title"], "date": commit["date"]}


def file_json(h, repo: dict, sha: str, path: str, entry: dict, expand: bool) -> dict:
    out = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
    if entry["lfs"]:
        pointer = gitobj.lfs_pointer(entry["sha256"], entry["size"])
        out["lfs"] = {"oid": entry["sha256"], "size": entry["size"], "pointerSize": len(pointer)}
    if expand:
        out["lastCommit"] = _last_commit(h, repo, sha, path, False)
        out["securityFileStatus"] = SECURITY_OK
    return out


def folder_json(h, repo: dict, sha: str, tree: dict, path: str, expand: bool) -> dict:
    out = {"type": "directory", "oid": gitobj.tree_oid(tree, path + "/"), "size": 0, "path": path}
    if expand:
        out["lastCommit"] = _last_commit(h, repo, sha, path, True)
    return out


def safetensors_header(h, entry: dict) -> dict | None:
    try:
        with open(h.store.object_path(entry["sha256"]), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100_000_000:
                return None
            return json.loads(f.read(n))
    except (OSError, ValueError, struct.error):
        return None


def _safetensors_summary(h, tree: dict) -> dict | None:
    params: dict[str, int] = {}
    for path, entry in tree.items():
        if path.endswith(".safetensors") and (header := safetensors_header(h, entry)):
            for name, info in header.items():
                if name != "__metadata__" and isinstance(info, dict):
                    count = 1
                    for dim in info.get("shape") or []:
                        count *= dim if isinstance(dim, int) else 0
                    dtype = str(info.get("dtype", "?"))
                    params[dtype] = params.get(dtype, 0) + count
    return {"parameters": params, "total": sum(params.values())} if params else None


def _next_link(h, key: str, value: int) -> dict:
    params = {k: v for k, v in h.query.items() if k != key}
    params[key] = [str(value)]
    url = f"{h.hub.endpoint}{h.path.partition('?')[0]}?{urlencode(params, doseq=True)}"
    return {"Link": f'<{url}>; rel="next"'}


# ------------------------------------------------------------------- routes
def info(h, repo_id: str, rev: str | None) -> None:
    repo, sha, tree = snapshot(h, repo_id, rev or "main")
    blobs = h.query_flag("blobs")
    siblings = []
    for path in sorted(tree):
        sib = {"rfilename": path}
        if blobs:
            entry = file_json(h, repo, sha, path, tree[path], False)
            sib.update(size=entry["size"], blobId=entry["oid"])
            if "lfs" in entry:
                sib["lfs"] = {"size": entry["size"], "sha256": entry["lfs"]["oid"],
                              "pointerSize": entry["lfs"]["pointerSize"]}
        siblings.append(sib)
    commit = repo["commits"][sha]
    data = {"_id": gitobj.sha256_hex(repo_id.encode())[:24], "id": repo_id, "modelId": repo_id,
            "author": repo_id.split("/")[0], "sha": sha, "lastModified": commit["date"],
            "createdAt": repo["createdAt"], "private": repo["private"], "gated": False, "disabled": False,
            "downloads": 0, "likes": 0, "tags": [], "siblings": siblings, "spaces": [],
            "usedStorage": sum(e["size"] for e in tree.values())}
    card = cardmeta.parse_front_matter(h.store.text_at(tree, "README.md") or "")
    if card is not None:
        data["cardData"] = {k: v for k, v in card.items() if k not in ("model-index", "eval_results")}
        tags = card.get("tags")
        data["tags"] = [t for t in tags if isinstance(t, str)] if isinstance(tags, list) else []
    if (st := _safetensors_summary(h, tree)) is not None:
        data["safetensors"] = st
    if h.query_flag("securityStatus"):
        data["securityRepoStatus"] = {"scansDone": True, "filesWithIssues": []}
    h.send_json(200, data)


def list_models(h) -> None:
    """GET /api/models?search=&author=&limit= (public repos, plus private ones with the token)."""
    search, author = h.query_value("search", ""), h.query_value("author")
    limit = h.query_int("limit")
    with h.store.lock:
        repos = [(rid, h.store.get(rid)) for rid in h.store.repo_ids()]
        out = [{"id": rid, "modelId": rid, "author": rid.split("/")[0], "private": repo["private"],
                "sha": repo["refs"].get("refs/heads/main"), "createdAt": repo["createdAt"]}
               for rid, repo in repos
               if (not repo["private"] or h.auth_state() == "ok") and search.lower() in rid.lower()
               and (author is None or rid.split("/")[0] == author)]
    h.send_json(200, out[:limit] if limit > 0 else out)


def tree(h, repo_id: str, segs: list[str]) -> None:
    rev, rest = take_rev(segs)
    path = "/".join(rest).strip("/")
    repo, sha, table = snapshot(h, repo_id, rev)
    recursive, expand = h.query_flag("recursive"), h.query_flag("expand")
    try:
        files, dirs = Store.list_tree(table, path, recursive)
    except KeyError:
        raise entry_not_found(path, sha) from None
    items = sorted([(p, True) for p in dirs] + [(p, False) for p in files])
    limit = max(1, min(h.hub.tree_page_size, 50) if expand else h.hub.tree_page_size)
    cursor = max(0, h.query_int("cursor"))
    page = items[cursor:cursor + limit]
    out = [folder_json(h, repo, sha, table, p, expand) if is_dir else file_json(h, repo, sha, p, table[p], expand)
           for p, is_dir in page]
    headers = _next_link(h, "cursor", cursor + limit) if cursor + limit < len(items) else {}
    h.send_json(200, out, headers)


def paths_info(h, repo_id: str, segs: list[str]) -> None:
    rev, _ = take_rev(segs)
    body = h.read_form_or_json()
    paths = body.get("paths") or []
    paths = [paths] if isinstance(paths, str) else paths
    expand = body.get("expand")
    expand = (expand[-1] if isinstance(expand, list) else str(expand)).lower() in ("1", "true") if expand else False
    repo, sha, table = snapshot(h, repo_id, rev)
    out = []
    for path in paths:
        if path in table:
            out.append(file_json(h, repo, sha, path, table[path], expand))
        elif path.strip("/") and any(p.startswith(path.strip("/") + "/") for p in table):
            out.append(folder_json(h, repo, sha, table, path.strip("/"), expand))
    h.send_json(200, out)


def refs(h, repo_id: str) -> None:
    with h.store.lock:
        repo = load_repo(h, repo_id)
        items = sorted(repo["refs"].items())
    def pick(prefix: str, strip: bool) -> list[dict]:
        return [{"name": name[len(prefix):] if strip else name, "ref": name, "targetCommit": sha}
                for name, sha in items if name.startswith(prefix)]
    data = {"branches": pick("refs/heads/", True), "tags": pick("refs/tags/", True),
            "converts": pick("refs/convert/", True)}
    if h.query_flag("include_prs"):
        data["pullRequests"] = sorted(pick("refs/pr/", False), key=lambda r: int(r["ref"].rsplit("/", 1)[1]))
    h.send_json(200, data)


def commits(h, repo_id: str, segs: list[str]) -> None:
    rev, _ = take_rev(segs)
    repo, sha, _ = snapshot(h, repo_id, rev)
    with h.store.lock:
        history = h.store.history(repo, sha)
    size = max(1, h.hub.commits_page_size)
    page_no = max(0, h.query_int("p"))
    formatted = "formatted" in h.query.get("expand[]", []) + h.query.get("expand", [])
    out = []
    for c in history[page_no * size:(page_no + 1) * size]:
        item = {"id": c["id"], "title": c["title"], "message": c["message"], "date": c["date"],
                "authors": [{"user": c["author"], "avatar": ""}]}
        if formatted:
            item["formatted"] = {"title": c["title"], "message": c["message"]}
        out.append(item)
    headers = _next_link(h, "p", page_no + 1) if (page_no + 1) * size < len(history) else {}
    h.send_json(200, out, headers)


def parse_range(value: str, size: int):
    """``(start, end)`` inclusive, ``"unsatisfiable"``, or None (syntax we ignore -> full 200 answer)."""
    m = re.fullmatch(r"\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*", value)
    if not m or not (m[1] or m[2]):
        return None
    if m[1]:
        start = int(m[1])
        end = int(m[2]) if m[2] else size - 1
        if start >= size or end < start:
            return "unsatisfiable"
        return start, min(end, size - 1)
    suffix = int(m[2])
    if suffix == 0 or size == 0:
        return "unsatisfiable"
    return max(0, size - suffix), size - 1


def resolve_file(h, repo_id: str, segs: list[str]) -> None:
    rev, rest = take_rev(segs)
    path = "/".join(rest)
    _, sha, table = snapshot(h, repo_id, rev)
    entry = table.get(path)
    if entry is None:
        raise entry_not_found(path, sha)
    size = entry["size"]
    name = path.rsplit("/", 1)[-1]
    headers = {"X-Repo-Commit": sha, "ETag": f'"{entry["oid"]}"', "Accept-Ranges": "bytes",
               "Content-Disposition": f"inline; filename*=UTF-8''{quote(name)}"}
    if entry["lfs"]:
        headers.update({"X-Linked-Etag": f'"{entry["sha256"]}"', "X-Linked-Size": str(size)})
    start, end, status = 0, size - 1, 200
    requested = h.headers.get("Range")
    if requested and h.method == "GET":
        parsed = parse_range(requested, size)
        if parsed == "unsatisfiable":
            raise HubError(416, "Range Not Satisfiable", headers={**headers, "Content-Range": f"bytes */{size}"})
        if parsed is not None:
            start, end, status = parsed[0], parsed[1], 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
    length = max(0, end - start + 1)
    h.send_bytes(status, b"", headers, length=length)
    if h.method == "HEAD" or length == 0:
        return
    with open(h.store.object_path(entry["sha256"]), "rb") as f:
        f.seek(start)
        remaining = length
        while remaining > 0:
            block = f.read(min(STREAM_CHUNK, remaining))
            if not block:
                break
            h.wfile.write(block)
            remaining -= len(block)


def safetensors_metadata(h, repo_id: str, segs: list[str]) -> None:
    """GET /api/models/{repo}/safetensors-metadata/{index} (used by get_sharded_safetensors_metadata; main only)."""
    filename = "/".join(segs) or "model.safetensors.index.json"
    _, sha, table = snapshot(h, repo_id, "main")
    if filename not in table:
        raise entry_not_found(filename, sha)
    try:
        index = json.loads(h.store.file_bytes(table[filename]))
    except ValueError:
        raise HubError(400, f"{filename} is not valid JSON") from None
    headers = {}
    for shard in sorted(set(index.get("weight_map", {}).values())):
        if shard not in table or (header := safetensors_header(h, table[shard])) is None:
            raise entry_not_found(shard, sha)
        headers[shard] = header
    h.send_json(200, {"index": index, "headers": headers})
