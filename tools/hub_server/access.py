"""Who may write what, as on the Hub (classic token roles).

A ``write`` token may change repos in its user's namespace and in organizations where the user's role
is admin, write or contributor, and may propose changes (open pull requests and discussions, upload
their LFS files) on any repo it can read. A ``read`` token may do neither: 403, as on the Hub. Checked
in that order: a token at all (401), the repo exists and is visible (404), then the right (403).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import HubError

WRITER_ROLES = ("admin", "write", "contributor")
READ_ONLY = "Forbidden: you must use a write token to upload to a repository."


@dataclass(frozen=True)
class Grant:
    """What one token is: its user and its role ("write" | "read")."""

    user: str
    role: str


def namespace(repo_id: str) -> str:
    return repo_id.split("/", 1)[0]


def may_see_private(h, repo_id: str) -> bool:
    """A private repo is visible to the accounts of its namespace: its user, or the organization's members."""
    user = h.grant().user
    return namespace(repo_id) == user or (user == h.hub.user and namespace(repo_id) in h.hub.orgs)


def require(h, repo_id: str, level: str, *, creating: bool = False) -> str:
    """The token's user, when it may `level` ("write": change content or settings, "propose": open a
    pull request or discussion) on `repo_id`; else the Hub's 403."""
    user = h.require_auth()
    grant = h.grant()
    if grant.role != "write":
        raise HubError(403, READ_ONLY)
    if level == "write" and namespace(repo_id) not in h.hub.namespaces(user):
        if creating:
            raise HubError(403, f'You don\'t have the rights to create a model under the namespace "{namespace(repo_id)}"')
        raise HubError(403, f"You don't have the rights to write to {repo_id}; open a pull request instead")
    return user

