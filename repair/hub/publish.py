"""Publishing a fix: the fork (a server-side duplicate of SRC, reused when it exists), pre-uploads file
by file, and ONE commit; or a pull request on SRC based on the pinned commit.

Nothing here changes a branch except `commit`, and that is one atomic create_commit with
`parent_commit` set, so a failed or interrupted run leaves no partial commit. A fork this run
created (or an earlier interrupted run created) is an unmodified copy of SRC until that commit.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from repair.errors import OutputError, RepairError
from repair.hub import client
from repair.hub.errors import hub_call
from repair.hub.remote import RemoteFile, RemoteRepo, listed_file
from repair.io.parse import parse_json, read_text
from repair.execute.report import REPORT_NAME

KEEP_ALWAYS = (".gitattributes",)  # a fork keeps its own when the source has none


@dataclass(frozen=True)
class Fork:
    """The destination repo as it is now (exists=False: not yet created)."""

    repo: str
    exists: bool
    head: str | None = None
    tree: dict[str, RemoteFile] = field(default_factory=dict)
    has_pinned: bool = False  # the pinned source commit is in its history: unchanged LFS files can be copied server-side
    report: dict | None = None  # its repair_report.json
    created: str | None = None  # "duplicated" | "created" when this run made it


def look(dst: str, src: RemoteRepo, work: Path) -> Fork:
    """Read the destination's state without changing anything; refuse a repo that is no fork of SRC."""
    api = client.api()
    with hub_call(f"--to {dst}"):
        if not api.repo_exists(dst):
            return Fork(dst, exists=False)
        head = api.model_info(dst).sha
        entries = list(api.list_repo_tree(dst, revision=head, recursive=True))
        has_pinned = api.revision_exists(dst, src.sha)
    tree = _tree(entries, f"{dst}@{head}")
    report = _read_report(dst, head, work) if REPORT_NAME in tree else None
    fork = Fork(dst, True, head, tree, has_pinned, report)
    from_src = isinstance(report, dict) and str((report.get("source") or {}).get("path", "")).startswith(f"{src.repo}@")
    if not (has_pinned or from_src or set(tree) <= set(KEEP_ALWAYS)):
        raise OutputError(
            f"--to {dst}: exists and is not a fork of {src.repo} (it lacks commit {src.sha[:12]} and has no ckpt-repair "
            "report from it); choose another --to, or delete that repo first"
        )
    return fork


def _tree(entries, label: str) -> dict[str, RemoteFile]:
    from huggingface_hub.hf_api import RepoFile

    return {f.name: f for f in (listed_file(e, label) for e in entries if isinstance(e, RepoFile))}


def _read_report(dst: str, head: str, work: Path) -> dict | None:
    with hub_call(f"{dst}@{head}/{REPORT_NAME}"):
        path = client.download(dst, head, REPORT_NAME, local_dir=work / "dst")
    try:  # a report we cannot read (any way: bad bytes, deep nesting, long numbers) is not one we wrote
        value = parse_json(read_text(path, "ignored"), path, "ignored")
    except RepairError:
        return None
    return value if isinstance(value, dict) else None


def create(fork: Fork, src: RemoteRepo, work: Path, *, private: bool, say: Callable[[str], None]) -> Fork:
    """Make the fork when it does not exist: a server-side duplicate of SRC (nothing is re-uploaded);
    where the server cannot duplicate, an empty repo that the commit then fills."""
    if fork.exists:
        return fork
    from huggingface_hub.errors import HfHubHTTPError

    api = client.api()
    how = "duplicated"
    try:
        with hub_call(f"--to {fork.repo}", writing=True):
            try:
                api.duplicate_repo(src.repo, fork.repo, private=True if private else None)
            except HfHubHTTPError as exc:
                if exc.response is None or exc.response.status_code not in (404, 405, 501) or api.repo_exists(fork.repo):
                    raise
                say(f"{src.repo}: the server cannot duplicate repos (HTTP {exc.response.status_code}); creating {fork.repo} and uploading every file")
                api.create_repo(fork.repo, private=private)
                how = "created"
    except OutputError as err:
        raise OutputError(str(err).replace("nothing was committed, re-run", "nothing was created, re-run")) from None
    return replace(look(fork.repo, src, work), created=how)


def already_fixed(fork: Fork, label: str, recipe: dict, options: dict, removed: tuple[str, ...]) -> bool:
    """The fork's head already is this exact fix: its report names this source commit, recipe and options,
    and every file the report lists is there with the recorded sha256 (LFS files; others by presence)."""
    report = fork.report
    if not fork.exists or not report or (report.get("source") or {}).get("path") != label:
        return False
    if report.get("recipe") != recipe or report.get("options") != options:
        return False
    listed = {o.get("name"): o.get("sha256") for o in report.get("outputs", []) if isinstance(o, dict)}
    for name, digest in listed.items():
        got = fork.tree.get(name)
        if got is None or (got.is_lfs and got.sha256 != digest):
            return False
    return not any(n in fork.tree for n in removed)


def reconcile(fork: Fork, src: RemoteRepo, written: set[str], removed: set[str]):
    """Operations that make the fork's tree the pinned source's (apart from what the fix writes):
    (server-side copies, deletions, names that must be uploaded from the source)."""
    from huggingface_hub import CommitOperationCopy, CommitOperationDelete

    copies, uploads = [], []
    wanted = {n for n in src.files if n not in removed and n not in written}
    for name in sorted(wanted):
        have, want = fork.tree.get(name), src.files[name]
        if have is not None and have.blob_id == want.blob_id and have.size == want.size:
            continue
        if want.is_lfs and fork.has_pinned:
            copies.append(CommitOperationCopy(name, name, src_revision=src.sha))
        else:
            uploads.append(name)
    deletes = [CommitOperationDelete(n) for n in sorted(fork.tree) if n not in wanted and n not in written and n not in KEEP_ALWAYS]
    return copies, deletes, uploads


def find_open_pr(repo: str, title: str) -> str | None:
    """The URL of an open (or draft) pull request on `repo` with exactly this title, if any."""
    api = client.api()
    with hub_call(f"{repo} (pull requests)"):
        for d in api.get_repo_discussions(repo, discussion_type="pull_request"):
            if d.title == title and d.status in ("open", "draft"):
                return f"{client.endpoint()}/{repo}/discussions/{d.num}"
    return None


def preupload(repo: str, op, *, pr: bool) -> bool:
    """Upload one file's content ahead of the commit; True when it went (or already was) to LFS storage,
    so the local copy may be deleted (the commit then only names its sha256)."""
    api = client.api()
    with hub_call(f"{repo}: {op.path_in_repo}", writing=True):
        api.preupload_lfs_files(repo, additions=[op], create_pr=pr)
    return getattr(op, "_upload_mode", None) == "lfs"


def commit(repo: str, ops: list, *, title: str, description: str, parent: str, pr: bool):
    """The one commit (or the pull request): atomic, against `parent`."""
    api = client.api()
    with hub_call(repo, writing=True):
        return api.create_commit(repo, operations=ops, commit_message=title, commit_description=description,
                                 parent_commit=parent, create_pr=pr)
