"""The one exception the route code raises to answer with an HTTP error."""

from __future__ import annotations


class HubError(Exception):
    """An HTTP error answer: status, message (also sent as ``X-Error-Message``) and optional ``X-Error-Code``.

    ``extra`` is merged into the JSON body (e.g. ``{"url": ...}`` on a 409 from repo creation).
    """

    def __init__(self, status: int, message: str, code: str | None = None, *, headers: dict | None = None,
                 extra: dict | None = None):
        super().__init__(f"{status} {message}")
        self.status = status
        self.message = message
        self.code = code
        self.headers = dict(headers or {})
        self.extra = dict(extra or {})


def repo_not_found(repo_id: str, status: int = 404) -> HubError:
    return HubError(status, f"Repository not found: {repo_id}", "RepoNotFound")


def revision_not_found(rev: str) -> HubError:
    return HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")


def entry_not_found(path: str, commit: str | None = None, message: str | None = None) -> HubError:
    headers = {"X-Repo-Commit": commit} if commit else {}
    return HubError(404, message or f"Entry not found: {path}", "EntryNotFound", headers=headers)
