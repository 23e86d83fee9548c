"""Account and repo-management routes: whoami, create/delete/duplicate repo, settings, branches, tags,
README YAML validation."""

from __future__ import annotations

from . import access, cardmeta, gitobj
from .errors import HubError, revision_not_found
from .routes_read import load_repo, resolve
from .store import check_repo_id


def whoami(h) -> None:
    """GET /api/whoami-v2: the user, its organizations with its role in each, and the token's role."""
    user = h.require_auth()
    orgs = [{"type": "org", "name": org, "fullname": org, "roleInOrg": role} for org, role in sorted(h.hub.orgs.items())]
    h.send_json(200, {
        "type": "user", "id": gitobj.sha256_hex(user.encode())[:24], "name": user, "fullname": user.title(),
        "email": f"{user}@localhub.test", "emailVerified": True, "canPay": False, "isPro": False,
        "periodEnd": None, "avatarUrl": "", "orgs": orgs,
        "auth": {"type": "access_token",
                 "accessToken": {"displayName": "localhub", "role": h.grant().role, "createdAt": gitobj.now_iso()}},
    })


def auth_check(h, repo_id: str, rest: list[str]) -> None:
    """GET /api/models/{repo}/auth-check[/write]: 200 when the token may read (write: change the content of)
    the repo; else the answer the repo's routes would give (401 / 404 RepoNotFound / 403)."""
    with h.store.lock:
        load_repo(h, repo_id, write="write" if rest == ["write"] else None)
    h.send_json(200, {})


def _visibility(body: dict, default: bool) -> bool:
    if body.get("visibility") in ("private", "public"):
        return body["visibility"] == "private"
    if isinstance(body.get("private"), bool):
        return body["private"]
    return default


def _repo_id_from(body: dict, user: str) -> str:
    name = body.get("name")
    if not isinstance(name, str) or not name:
        raise HubError(400, "Missing repo name")
    return check_repo_id(f"{body.get('organization') or user}/{name}")


def repos_action(h, action: str) -> None:
    """POST /api/repos/create | DELETE /api/repos/delete | POST /api/repos/move (where the token may write)."""
    user = h.require_auth()
    body = h.read_json()
    if body.get("type") not in (None, "model"):
        raise HubError(400, "LocalHub only hosts model repos")
    if action == "create":
        repo_id = _repo_id_from(body, user)
        access.require(h, repo_id, "write", creating=True)
        url = f"{h.hub.endpoint}/{repo_id}"
        with h.store.lock:
            if h.store.get(repo_id) is not None:
                raise HubError(409, "You already created this model repo", extra={"url": url})
            gitattributes = h.store.entry_for_bytes(gitobj.DEFAULT_GITATTRIBUTES.encode(), lfs=False)
            h.store.create(repo_id, private=_visibility(body, False), author=user,
                           tree={".gitattributes": gitattributes}, title="initial commit")
        h.send_json(200, {"url": url, "name": repo_id, "id": gitobj.sha256_hex(repo_id.encode())[:24]})
    elif action == "delete":
        repo_id = _repo_id_from(body, user)
        with h.store.lock:
            load_repo(h, repo_id, write="write")
            h.store.delete(repo_id)
        h.send_json(200, {})
    elif action == "move":
        src, dst = body.get("fromRepo", ""), check_repo_id(body.get("toRepo", ""))
        access.require(h, dst, "write", creating=True)
        with h.store.lock:
            repo = load_repo(h, src, write="write")
            if h.store.get(dst) is not None:
                raise HubError(409, f"Repository {dst} already exists")
            h.store.delete(src)
            repo["id"] = dst
            h.store.register(repo)
        h.send_json(200, {})
    else:
        raise HubError(404, f"Unknown action: {action}")


def duplicate(h, from_id: str) -> None:
    """POST /api/models/{from}/duplicate {"repository": "ns/name", "visibility"?}.

    The copy keeps the source's ``main`` history verbatim (same commit shas), without other refs or discussions.
    """
    h.require_auth()
    body = h.read_json()
    target = check_repo_id(body.get("repository", ""))
    access.require(h, target, "write", creating=True)
    url = f"{h.hub.endpoint}/{target}"
    with h.store.lock:
        src = load_repo(h, from_id)
        if h.store.get(target) is not None:
            raise HubError(409, f"Repository {target} already exists", extra={"url": url})
        head = src["refs"]["refs/heads/main"]
        commits = {sha: dict(src["commits"][sha]) for sha in h.store.ancestors(src, head)}
        h.store.register({"id": target, "type": "model", "private": _visibility(body, src["private"]),
                          "createdAt": gitobj.now_iso(), "commits": commits,
                          "refs": {"refs/heads/main": head}, "discussions": []})
    h.send_json(200, {"url": url, "filesCopyPending": False})


def settings(h, repo_id: str) -> None:
    """PUT /api/models/{repo}/settings: only visibility is stored; gating and the rest are accepted and ignored."""
    body = h.read_json()
    with h.store.lock:
        repo = load_repo(h, repo_id, write="write")
        repo["private"] = _visibility(body, repo["private"])
        h.store.save(repo)
    h.send_json(200, {})


def branch(h, repo_id: str, name: str) -> None:
    """POST (create, optional {"startingPoint"}) or DELETE /api/models/{repo}/branch/{name}."""
    body = h.read_json() if h.method == "POST" else {}
    ref = f"refs/heads/{name}"
    with h.store.lock:
        repo = load_repo(h, repo_id, write="write")
        if h.method == "POST":
            if ref in repo["refs"]:
                raise HubError(409, f"Reference {ref} already exists")
            repo["refs"][ref] = resolve(h, repo, body.get("startingPoint") or "main")[0]
        else:
            if ref not in repo["refs"]:
                raise revision_not_found(name)
            if name == "main":
                raise HubError(403, "Cannot delete the default branch")
            del repo["refs"][ref]
        h.store.save(repo)
    h.send_json(200, {})


def tag(h, repo_id: str, rev_or_tag: str) -> None:
    """POST /api/models/{repo}/tag/{rev} {"tag", "message"?} creates a tag; DELETE /tag/{tag} removes one."""
    body = h.read_json() if h.method == "POST" else {}
    with h.store.lock:
        repo = load_repo(h, repo_id, write="write")
        if h.method == "POST":
            ref = f"refs/tags/{body.get('tag', '')}"
            if ref == "refs/tags/":
                raise HubError(400, "Missing tag name")
            if ref in repo["refs"]:
                raise HubError(409, f"Tag {body['tag']} already exists")
            repo["refs"][ref] = resolve(h, repo, rev_or_tag)[0]
        else:
            if f"refs/tags/{rev_or_tag}" not in repo["refs"]:
                raise revision_not_found(rev_or_tag)
            del repo["refs"][f"refs/tags/{rev_or_tag}"]
        h.store.save(repo)
    h.send_json(200, {})


def validate_yaml(h) -> None:
    """POST /api/validate-yaml {"content", "repoType"} -> {"errors": [...], "warnings": [...]} (400 on errors)."""
    body = h.read_json()
    errors = cardmeta.front_matter_errors(str(body.get("content", "")))
    h.send_json(400 if errors else 200, {"errors": [{"message": e} for e in errors], "warnings": []})
