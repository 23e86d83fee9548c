"""On-disk state of the local Hub: content-addressed objects, repos, commits and refs.

Layout under ``root``::

    objects/ab/<sha256>     file contents (regular and LFS alike), addressed by sha256
    repos/<ns>/<name>.json  one JSON document per repo: commits (each with its full file table), refs, discussions
    tmp/                    uploads in flight (moved into objects/ only once their sha256 checks out)

A file table (``tree``) maps a repo path, stored verbatim, to an entry
``{"sha256", "size", "lfs": bool, "oid"}`` where ``oid`` is the git blob id (see :mod:`gitobj`).
Every public method that reads or changes repo state must be called with ``store.lock`` held, or is
documented as taking it.
"""

from __future__ import annotations

import json
import os
import re
import threading
import uuid
from pathlib import Path

from . import gitobj
from .errors import HubError, entry_not_found

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def check_repo_id(repo_id: str) -> str:
    parts = repo_id.split("/")
    if len(parts) != 2 or not all(_NAME.match(p) and not p.endswith(".git") for p in parts):
        raise HubError(400, f"Invalid repo id: {repo_id!r} (expected 'namespace/name')")
    return repo_id


class Store:
    def __init__(self, root: Path):
        self.root = Path(root)
        self.objects_dir = self.root / "objects"
        self.repos_dir = self.root / "repos"
        self.tmp_dir = self.root / "tmp"
        for d in (self.objects_dir, self.repos_dir, self.tmp_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.lock = threading.RLock()
        self._repos: dict[str, dict] = {}
        for path in sorted(self.repos_dir.glob("*/*.json")):
            repo = json.loads(path.read_text())
            self._repos[repo["id"]] = repo

    # ---------------------------------------------------------------- objects
    def object_path(self, sha256: str) -> Path:
        return self.objects_dir / sha256[:2] / sha256

    def object_size(self, sha256: str) -> int | None:
        if not gitobj.is_hex(sha256, (64,)):
            return None
        path = self.object_path(sha256.lower())
        return path.stat().st_size if path.is_file() else None

    def new_tmp_path(self, tag: str = "upload") -> Path:
        return self.tmp_dir / f"{tag}-{uuid.uuid4().hex}"

    def adopt(self, tmp: Path, sha256: str) -> None:
        """Move a fully written and verified temp file into the object store."""
        dest = self.object_path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(tmp, dest)

    def put_bytes(self, data: bytes) -> str:
        sha = gitobj.sha256_hex(data)
        if self.object_size(sha) is None:
            tmp = self.new_tmp_path("blob")
            tmp.write_bytes(data)
            self.adopt(tmp, sha)
        return sha

    def read_object(self, sha256: str) -> bytes:
        return self.object_path(sha256).read_bytes()

    def entry_for_bytes(self, data: bytes, *, lfs: bool) -> dict:
        sha = self.put_bytes(data)
        oid = gitobj.git_blob_oid(gitobj.lfs_pointer(sha, len(data))) if lfs else gitobj.git_blob_oid(data)
        return {"sha256": sha, "size": len(data), "lfs": lfs, "oid": oid}

    def entry_for_lfs_object(self, sha256: str, size: int) -> dict:
        oid = gitobj.git_blob_oid(gitobj.lfs_pointer(sha256, size))
        return {"sha256": sha256, "size": size, "lfs": True, "oid": oid}

    # ------------------------------------------------------------------ repos
    def get(self, repo_id: str) -> dict | None:
        return self._repos.get(repo_id)

    def repo_ids(self) -> list[str]:
        return sorted(self._repos)

    def save(self, repo: dict) -> None:
        path = self.repos_dir / f"{repo['id']}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".{uuid.uuid4().hex}.tmp")
        tmp.write_text(json.dumps(repo))
        os.replace(tmp, path)

    def create(self, repo_id: str, *, private: bool, author: str, tree: dict[str, dict],
               title: str = "initial commit", message: str = "") -> dict:
        check_repo_id(repo_id)
        if repo_id in self._repos:
            raise HubError(409, f"You already created this model repo: {repo_id}")
        repo = {"id": repo_id, "type": "model", "private": bool(private), "createdAt": gitobj.now_iso(),
                "commits": {}, "refs": {}, "discussions": []}
        sha = self.add_commit(repo, parents=[], tree=tree, title=title, message=message, author=author)
        repo["refs"]["refs/heads/main"] = sha
        self._repos[repo_id] = repo
        self.save(repo)
        return repo

    def register(self, repo: dict) -> None:
        """Add a fully built repo document (duplicate / move)."""
        self._repos[check_repo_id(repo["id"])] = repo
        self.save(repo)

    def delete(self, repo_id: str) -> None:
        self._repos.pop(repo_id, None)
        (self.repos_dir / f"{repo_id}.json").unlink(missing_ok=True)

    def add_commit(self, repo: dict, *, parents: list[str], tree: dict[str, dict], title: str, message: str,
                   author: str) -> str:
        date = gitobj.now_iso()
        sha = gitobj.commit_oid(tree=gitobj.tree_oid(tree), parents=parents, author=author, date=date,
                                title=title, message=message)
        repo["commits"][sha] = {"id": sha, "parents": list(parents), "tree": dict(tree), "title": title,
                                "message": message, "author": author, "date": date}
        return sha

    # ------------------------------------------------------------- revisions
    def resolve(self, repo: dict, rev: str) -> tuple[str, str | None] | None:
        """``(commit sha, full ref name or None)`` for a branch, tag, ``refs/...`` name or (short) sha."""
        refs = repo["refs"]
        if rev.startswith("refs/"):
            return (refs[rev], rev) if rev in refs else None
        for name in (f"refs/heads/{rev}", f"refs/tags/{rev}"):
            if name in refs:
                return refs[name], name
        low = rev.lower()
        if gitobj.is_hex(low, (40,)) and low in repo["commits"]:
            return low, None
        if 7 <= len(low) < 40 and gitobj.is_hex(low, (len(low),)):
            hits = [sha for sha in repo["commits"] if sha.startswith(low)]
            if len(hits) == 1:
                return hits[0], None
        return None

    def tree(self, repo: dict, sha: str) -> dict[str, dict]:
        return repo["commits"][sha]["tree"]

    def history(self, repo: dict, sha: str) -> list[dict]:
        """First-parent history, newest first."""
        out, seen = [], set()
        while sha and sha not in seen:
            seen.add(sha)
            commit = repo["commits"][sha]
            out.append(commit)
            sha = commit["parents"][0] if commit["parents"] else None
        return out

    def ancestors(self, repo: dict, sha: str) -> set[str]:
        todo, seen = [sha], set()
        while todo:
            cur = todo.pop()
            if cur not in seen:
                seen.add(cur)
                todo.extend(repo["commits"][cur]["parents"])
        return seen

    def last_change(self, repo: dict, sha: str, path: str, is_dir: bool) -> dict:
        """The oldest commit in first-parent history since which ``path`` is unchanged."""
        def key(tree: dict):
            return gitobj.tree_oid(tree, path + "/") if is_dir else (tree.get(path) or {}).get("oid")

        cur = repo["commits"][sha]
        value = key(cur["tree"])
        while cur["parents"]:
            parent = repo["commits"][cur["parents"][0]]
            if key(parent["tree"]) != value:
                break
            cur = parent
        return cur

    # ------------------------------------------------------------ file tables
    @staticmethod
    def apply_ops(tree: dict[str, dict], ops: list[tuple], commit: str | None = None) -> dict[str, dict]:
        """New file table after ``("add", path, entry)``, ``("delete", path)``, ``("delete_folder", path)`` ops."""
        new = dict(tree)
        for op in ops:
            if op[0] == "add":
                new[op[1]] = op[2]
            elif op[0] == "delete":
                if op[1] not in new:
                    raise entry_not_found(op[1], commit, f"A file with this name doesn't exist: {op[1]}")
                del new[op[1]]
            elif op[0] == "delete_folder":
                prefix = op[1].rstrip("/") + "/"
                doomed = [p for p in new if p.startswith(prefix)]
                if not doomed:
                    raise entry_not_found(op[1], commit, f"A folder with this name doesn't exist: {op[1]}")
                for p in doomed:
                    del new[p]
        return new

    @staticmethod
    def list_tree(tree: dict[str, dict], prefix: str, recursive: bool) -> tuple[list[str], list[str]]:
        """(file paths, folder paths) below ``prefix``; raises KeyError when ``prefix`` is not a folder."""
        base = prefix.strip("/")
        base = base + "/" if base else ""
        files, dirs = [], set()
        for path in tree:
            if not path.startswith(base) or len(path) == len(base):
                continue
            parts = path[len(base):].split("/")
            if recursive:
                files.append(path)
                dirs.update(base + "/".join(parts[:i]) for i in range(1, len(parts)) if all(parts[:i]))
            elif len(parts) == 1 or not parts[0]:
                files.append(path)
            else:
                dirs.add(base + parts[0])
        if base and not files and not dirs:
            raise KeyError(prefix)
        return sorted(files), sorted(dirs)

    def file_bytes(self, entry: dict) -> bytes:
        return self.read_object(entry["sha256"])

    def text_at(self, tree: dict[str, dict], path: str) -> str | None:
        entry = tree.get(path)
        if entry is None:
            return None
        return self.file_bytes(entry).decode("utf-8", errors="replace")
