"""What a SRC argument names (a local folder or a Hub repo at a revision), and which remote file
names are safe to use.

`owner/name` or `owner/name@revision` (a branch, tag, `refs/pr/N` or commit sha) is a Hub repo
unless a local path of that spelling exists: a local path that exists always wins. Remote file
names come from a server and are checked before any of them is joined to a local folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from repair.errors import BadInput, UsageError
from repair.io.names import inside, name_problem

_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9_])?"
REPO_ID = re.compile(rf"{_PART}/{_PART}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class HubSpec:
    """A Hub model repo and the revision asked for (None: the default branch)."""

    repo: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{self.repo}@{self.revision}" if self.revision else self.repo


def hub_spec(src: str | Path) -> HubSpec | None:
    """The Hub repo SRC names, or None when it is (or can only be) a local path."""
    text = str(src)
    if Path(os.path.expanduser(text)).exists():  # Path.expanduser raises for `~unknown-user`
        return None
    repo, at, revision = text.partition("@")
    if not REPO_ID.fullmatch(repo) or "--" in repo or ".." in repo:
        if at:
            raise UsageError(f"{text}: not a local folder, and {repo!r} is not a Hub repo id (owner/name[@revision])")
        return None
    if at and (not revision or _CONTROL.search(revision) or revision.strip() != revision):
        raise UsageError(f"{text}: empty or malformed revision after '@'; give a branch, tag or commit sha")
    return HubSpec(repo, revision or None)


def repo_id(text: str, option: str) -> str:
    """A Hub repo id given to an option such as --to (no revision, no local paths)."""
    if not REPO_ID.fullmatch(text) or "--" in text or ".." in text:
        raise UsageError(f"{option} {text!r}: expected a Hub repo id owner/name")
    return text


def check_remote_name(name: object, where: str) -> str:
    """A file name from a server, refused unless it is a plain relative path that stays in its folder."""
    why = name_problem(name)
    if why is None and str(name).split("/")[0] == ".cache":
        why = "is inside .cache/ (reserved for huggingface_hub's download metadata)"
    if why:
        raise BadInput(f"{where}: remote file name {name!r} {why}; refusing to use this repo (names must stay inside its folder)")
    return str(name)


def local_path(root: Path, name: str, where: str) -> Path:
    """`root / name` for a checked remote name, verified to resolve inside `root` (links included)."""
    check_remote_name(name, where)
    return inside(root, name, where, "refusing to use this repo")
