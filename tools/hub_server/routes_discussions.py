"""Discussion / pull-request routes under /api/models/{repo}/discussions."""

from __future__ import annotations

from . import discussions
from .errors import HubError
from .routes_read import load_repo

PAGE_SIZE = 50


def root(h, repo_id: str) -> None:
    """GET lists (newest first, ?p=page&type=&status=&author=); POST {title, description, pullRequest} creates."""
    if h.method == "POST":
        user = h.require_auth()
        body = h.read_json()
        title = discussions.check_title(body.get("title", ""))
        is_pr = bool(body.get("pullRequest"))
        with h.store.lock:
            repo = load_repo(h, repo_id, write="propose")
            disc = discussions.create(repo, title=title, description=str(body.get("description") or ""),
                                      author=user, is_pr=is_pr, base_commit=repo["refs"]["refs/heads/main"])
            h.store.save(repo)
        h.send_json(200, {"num": disc["num"], "pullRequest": is_pr,
                          "url": f"{h.hub.endpoint}/{repo_id}/discussions/{disc['num']}"})
        return
    if h.method != "GET":
        raise HubError(405, "Method not allowed")
    kind, status, author = h.query_value("type", "all"), h.query_value("status", "all"), h.query_value("author")
    with h.store.lock:
        repo = load_repo(h, repo_id)
        items = [d for d in reversed(repo["discussions"])
                 if (kind == "all" or d["isPullRequest"] == (kind == "pull_request"))
                 and (status == "all" or d["status"] == status)
                 and (author is None or d["author"] == author)]
        closed = sum(d["status"] in ("closed", "merged") for d in repo["discussions"])
        page = max(0, h.query_int("p"))
        out = [discussions.summary(repo, d) for d in items[page * PAGE_SIZE:(page + 1) * PAGE_SIZE]]
    h.send_json(200, {"discussions": out, "count": len(items), "start": page * PAGE_SIZE,
                      "numClosedDiscussions": closed})


def one(h, repo_id: str, num_text: str, action: str | None) -> None:
    """GET .../discussions/{n}[?diff=1]; POST .../discussions/{n}/{comment|status|title|merge}."""
    if not num_text.isdigit():
        raise HubError(404, f"Discussion {num_text} not found")
    num = int(num_text)
    if action is None:
        if h.method != "GET":
            raise HubError(405, "Method not allowed")
        with h.store.lock:
            repo = load_repo(h, repo_id)
            data = discussions.details(h.store, repo, discussions.find(repo, num), h.query_flag("diff"))
        h.send_json(200, data)
        return
    if h.method != "POST":
        raise HubError(405, "Method not allowed")
    user = h.require_auth()
    body = h.read_json() or {}
    with h.store.lock:
        repo = load_repo(h, repo_id, write="write" if action == "merge" else "propose")
        disc = discussions.find(repo, num)
        if action == "comment":
            answer = {"newMessage": discussions.comment(disc, user, str(body.get("comment", "")))}
        elif action == "status":
            answer = {"newStatus": discussions.set_status(disc, user, str(body.get("status", "")),
                                                          body.get("comment"))}
        elif action == "title":
            answer = {"newTitle": discussions.rename(disc, user, str(body.get("title", "")))}
        elif action == "merge":
            discussions.merge(h.store, repo, disc, user, body.get("comment"))
            answer = {}
        else:
            raise HubError(404, f"Unknown discussion action {action!r}")
        h.store.save(repo)
    h.send_json(200, answer)
