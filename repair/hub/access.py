"""May this token do what `hub fix` is about to do? Asked before any shard byte is read, so a run that
would be refused at its first upload is refused at its start instead (nothing downloaded, nothing created).

The Hub answers through huggingface_hub's own calls: `auth_check(repo, write=True)` for a fork that
exists (the Hub's own content-write check), and `whoami` for what only the account can tell: the
namespaces it may create a repo in, and whether its token may open a pull request. Tokens are classic
(`read` or `write`) or `fineGrained` (permissions per user, organization or repo, plus global ones).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from repair.errors import UsageError
from repair.hub import client
from repair.hub.errors import LOGIN, hub_call

WRITER_ROLES = ("admin", "write", "contributor")  # organization roles that may create repos
CREATE = "repo.write"  # fine-grained permission: create and change repos of an entity
PROPOSE = "discussion.write"  # fine-grained permission: open discussions and pull requests


@dataclass(frozen=True)
class Grants:
    """What a token may do, from whoami-v2 (every field read defensively: it is a server's answer)."""

    user: str
    role: str  # "write" | "read" | "fineGrained" | anything else: refused as unknown
    orgs: dict[str, str] = field(default_factory=dict)  # organization -> the user's role in it
    scoped: dict[str, frozenset[str]] = field(default_factory=dict)  # entity (user, org, repo; casefolded) -> permissions
    everywhere: frozenset[str] = frozenset()  # fine-grained global permissions

    def namespaces(self) -> list[str]:
        return [self.user] + sorted(o for o, role in self.orgs.items() if role in WRITER_ROLES)

    def may_create_in(self, namespace: str) -> str | None:
        """None when it may create a repo under `namespace`; else why not."""
        if namespace.casefold() not in {n.casefold() for n in self.namespaces()}:  # Hub names ignore case
            return f"{self.user} may not create repos under {namespace!r} (only under {', '.join(self.namespaces())})"
        if self.role == "fineGrained" and CREATE not in self.scoped.get(namespace.casefold(), ()):
            return f"the fine-grained token lacks {CREATE!r} for {namespace!r}"
        return None if self.role in ("write", "fineGrained") else self._role_problem()

    def may_propose_on(self, repo: str) -> str | None:
        """None when it may open a pull request on `repo`; else why not."""
        if self.role == "fineGrained":
            owner, repo_key = repo.split("/")[0].casefold(), repo.casefold()
            perms = self.everywhere | self.scoped.get(owner, frozenset()) | self.scoped.get(repo_key, frozenset())
            return None if perms & {PROPOSE, CREATE} else f"the fine-grained token lacks {PROPOSE!r} for {repo}"
        return None if self.role == "write" else self._role_problem()

    def _role_problem(self) -> str:
        return "the token is read-only" if self.role == "read" else f"the token's role {self.role!r} is unknown"


def grants_of(whoami: object) -> Grants:
    """Grants from a whoami-v2 answer; anything malformed grants nothing."""
    me = whoami if isinstance(whoami, dict) else {}
    token = _dict(_dict(me.get("auth")).get("accessToken"))
    fine = _dict(token.get("fineGrained"))
    orgs = {o["name"]: str(o.get("roleInOrg")) for o in _list(me.get("orgs")) if isinstance(o, dict) and isinstance(o.get("name"), str)}
    scoped: dict[str, frozenset[str]] = {}
    for entry in _list(fine.get("scoped")):
        name = _dict(_dict(entry).get("entity")).get("name")
        if isinstance(name, str):
            scoped[name.casefold()] = scoped.get(name.casefold(), frozenset()) | _strings(_dict(entry).get("permissions"))
    return Grants(str(me.get("name") or ""), str(token.get("role") or ""), orgs, scoped, _strings(fine.get("global")))


def check(dst: str | None, dst_exists: bool, pr_on: str | None) -> str:
    """Refuse (one line) unless the token may write the fork `dst` (or create it) and, with `pr_on`, open a
    pull request there. Returns what it may do, for the progress line."""
    if dst and dst_exists:
        _check_writable(dst)
    creating = dst if dst and not dst_exists else None
    if creating or pr_on:
        _check_account(whoami(f"--to {dst}" if dst else f"--pr on {pr_on}"), creating, pr_on)
    may = ([f"write {dst}" if dst_exists else f"create {dst}"] if dst else []) + ([f"open a pull request on {pr_on}"] if pr_on else [])
    return " and ".join(may)


def _check_account(grants: Grants, creating: str | None, pr_on: str | None) -> None:
    why = grants.may_create_in(creating.split("/")[0]) if creating else None
    if why:
        raise UsageError(f"--to {creating}: {why}; choose another --to, or {LOGIN} with a token that may create it")
    why = grants.may_propose_on(pr_on) if pr_on else None
    if why:
        raise UsageError(f"--pr on {pr_on}: {why}, so it may not open a pull request; {LOGIN} with a token that may")


def whoami(subject: str) -> Grants:
    with hub_call(subject, writing=True):
        return grants_of(client.api().whoami())


def _check_writable(dst: str) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    with hub_call(f"--to {dst}", writing=True):
        try:
            client.api().auth_check(dst, write=True)
        except HfHubHTTPError as exc:
            if exc.response is None or exc.response.status_code != 403:
                raise
            raise UsageError(f"--to {dst}: the token may not write to this repo; choose another --to, or {LOGIN} with a token that may") from None


def _dict(value: object) -> dict:
    return value if isinstance(value, dict) else {}


def _list(value: object) -> list:
    return value if isinstance(value, list) else []


def _strings(value: object) -> frozenset[str]:
    return frozenset(v for v in _list(value) if isinstance(v, str))
