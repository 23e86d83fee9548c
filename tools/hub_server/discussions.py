"""Discussions and pull requests, kept inside the repo document (``repo["discussions"]``).

A pull request ``N`` owns the ref ``refs/pr/N``; ``baseCommit`` is the commit it branched from, which is
what its diff, conflict check and merge are computed against. Callers hold ``store.lock``.

Statuses follow the Hub: ``create_discussion(pull_request=True)`` opens a ``draft`` PR (and commits pushed to
it do not change that), ``create_commit(create_pr=True)`` opens an ``open`` one; merging sets ``merged``.
"""

from __future__ import annotations

import copy
import difflib
import html
import uuid

from . import gitobj
from .errors import HubError


def _author(name: str) -> dict:
    return {"name": name, "fullname": name, "type": "user", "avatarUrl": "", "isPro": False}


def _event(kind: str, author: str, data: dict) -> dict:
    return {"id": uuid.uuid4().hex[:24], "type": kind, "createdAt": gitobj.now_iso(), "author": _author(author),
            "data": data}


def _comment_event(author: str, text: str) -> dict:
    latest = {"raw": text, "html": f"<p>{html.escape(text)}</p>", "updatedAt": gitobj.now_iso(),
              "author": _author(author)}
    return _event("comment", author, {"edited": False, "hidden": False, "latest": latest, "numEdits": 0,
                                      "editors": [author], "reactions": [], "isReport": False})


def create(repo: dict, *, title: str, description: str, author: str, is_pr: bool, base_commit: str,
           base_ref: str = "refs/heads/main", status: str | None = None) -> dict:
    num = len(repo["discussions"]) + 1
    disc = {"num": num, "title": title.strip(), "status": status or ("draft" if is_pr else "open"), "isPullRequest": is_pr,
            "createdAt": gitobj.now_iso(), "author": author, "events": [_comment_event(author, description)]}
    if is_pr:
        disc.update(base=base_ref, baseCommit=base_commit, mergeCommitId=None)
        repo["refs"][f"refs/pr/{num}"] = base_commit
    repo["discussions"].append(disc)
    return disc


def find(repo: dict, num: int) -> dict:
    for disc in repo["discussions"]:
        if disc["num"] == num:
            return disc
    raise HubError(404, f"Discussion #{num} not found")


def add_commit(disc: dict, author: str, sha: str, title: str) -> None:
    disc["events"].append(_event("commit", author, {"subject": title, "oid": sha}))


def comment(disc: dict, author: str, text: str) -> dict:
    if not text.strip():
        raise HubError(400, "Comment cannot be empty")
    event = _comment_event(author, text)
    disc["events"].append(event)
    return event


def set_status(disc: dict, author: str, status: str, text: str | None = None) -> dict:
    if status not in ("open", "closed"):
        raise HubError(400, f"Invalid status: {status!r}")
    if disc["status"] == "merged":
        raise HubError(400, "This pull request has already been merged")
    if text:
        comment(disc, author, text)
    disc["status"] = status
    event = _event("status-change", author, {"status": status})
    disc["events"].append(event)
    return event


def check_title(title: str) -> str:
    title = (title or "").strip()
    if not 3 <= len(title) <= 200:
        raise HubError(400, "Discussion title must be between 3 and 200 characters")
    return title


def rename(disc: dict, author: str, title: str) -> dict:
    title = check_title(title)
    event = _event("title-change", author, {"from": disc["title"], "to": title})
    disc["title"] = title
    disc["events"].append(event)
    return event


def _changed(a: dict, b: dict) -> set[str]:
    return {p for p in a.keys() | b.keys() if a.get(p) != b.get(p)}


def conflicts(store, repo: dict, disc: dict) -> list[str]:
    base = store.tree(repo, disc["baseCommit"])
    head = store.tree(repo, repo["refs"][f"refs/pr/{disc['num']}"])
    target = store.tree(repo, repo["refs"][disc["base"]])
    return sorted(p for p in _changed(base, head) & _changed(base, target) if head.get(p) != target.get(p))


def merge(store, repo: dict, disc: dict, author: str, text: str | None = None) -> str:
    if not disc["isPullRequest"]:
        raise HubError(400, "Only pull requests can be merged")
    if disc["status"] in ("merged", "closed"):
        raise HubError(400, f"Cannot merge a {disc['status']} pull request")
    head_sha = repo["refs"][f"refs/pr/{disc['num']}"]
    target_sha = repo["refs"][disc["base"]]
    if target_sha in store.ancestors(repo, head_sha):  # fast-forward
        merged = head_sha
    else:
        clash = conflicts(store, repo, disc)
        if clash:
            raise HubError(409, "Pull request has merge conflicts", extra={"filesWithConflicts": clash})
        base, head = store.tree(repo, disc["baseCommit"]), store.tree(repo, head_sha)
        tree = dict(store.tree(repo, target_sha))
        for path in _changed(base, head):
            if path in head:
                tree[path] = head[path]
            else:
                tree.pop(path, None)
        merged = store.add_commit(repo, parents=[target_sha, head_sha], tree=tree, author=author,
                                  title=f"Merge pull request #{disc['num']}: {disc['title']}", message="")
    repo["refs"][disc["base"]] = merged
    if text:
        comment(disc, author, text)
    disc["status"], disc["mergeCommitId"] = "merged", merged
    disc["events"].append(_event("status-change", author, {"status": "merged"}))
    return merged


def diff_text(store, old: dict, new: dict) -> str:
    """A git-style diff between two file tables (text diff for small regular files, pointers for LFS)."""
    out = []
    for path in sorted(_changed(old, new)):
        a, b = old.get(path), new.get(path)
        out.append(f"diff --git a/{path} b/{path}")
        if a is None:
            out.append("new file mode 100644")
        elif b is None:
            out.append("deleted file mode 100644")
        out.append(f"index {(a or {}).get('oid', '0' * 7)[:7]}..{(b or {}).get('oid', '0' * 7)[:7]}")
        lines = [_diff_lines(store, e) for e in (a, b)]
        out.extend(difflib.unified_diff(lines[0], lines[1], f"a/{path}" if a else "/dev/null",
                                        f"b/{path}" if b else "/dev/null", lineterm=""))
    return "\n".join(out) + ("\n" if out else "")


def _diff_lines(store, entry: dict | None) -> list[str]:
    if entry is None:
        return []
    if entry["lfs"] or entry["size"] > 1_000_000:
        return gitobj.lfs_pointer(entry["sha256"], entry["size"]).decode().splitlines()
    data = store.file_bytes(entry)
    if b"\x00" in data[:8000]:
        return [f"Binary file ({entry['size']} bytes)"]
    return data.decode("utf-8", errors="replace").splitlines()


def summary(repo: dict, disc: dict) -> dict:
    return {"num": disc["num"], "title": disc["title"], "status": disc["status"],
            "isPullRequest": disc["isPullRequest"], "createdAt": disc["createdAt"], "author": _author(disc["author"]),
            "repo": {"name": repo["id"], "type": repo["type"]}, "pinned": False, "topReactions": [],
            "numComments": sum(e["type"] == "comment" for e in disc["events"])}


def details(store, repo: dict, disc: dict, with_diff: bool) -> dict:
    out = summary(repo, disc)
    out.update(events=copy.deepcopy(disc["events"]), locked=False)
    if disc["isPullRequest"]:
        out["changes"] = {"base": disc["base"]}
        if disc.get("mergeCommitId"):
            out["changes"]["mergeCommitId"] = disc["mergeCommitId"]
        out["filesWithConflicts"] = [] if disc["status"] == "merged" else conflicts(store, repo, disc)
        if with_diff:
            head = store.tree(repo, repo["refs"][f"refs/pr/{disc['num']}"])
            out["diff"] = diff_text(store, store.tree(repo, disc["baseCommit"]), head)
    return out


def for_assertions(repo: dict, disc: dict) -> dict:
    """Plain snapshot used by ``LocalHub.discussions``."""
    ref = f"refs/pr/{disc['num']}" if disc["isPullRequest"] else None
    comments = [e["data"]["latest"]["raw"] for e in disc["events"] if e["type"] == "comment"]
    return {"num": disc["num"], "title": disc["title"], "status": disc["status"],
            "is_pull_request": disc["isPullRequest"], "author": disc["author"],
            "description": comments[0] if comments else "", "comments": comments[1:], "ref": ref,
            "head": repo["refs"].get(ref) if ref else None, "base_ref": disc.get("base"),
            "base_commit": disc.get("baseCommit"), "merge_commit": disc.get("mergeCommitId"),
            "events": copy.deepcopy(disc["events"])}
