"""A Hub repo pinned to one commit: its sha and its file listing there (names checked), sizes and hashes.

Everything after `resolve` uses the sha, so a push during a run changes nothing we read. The mirror
built from this listing is repair.hub.source.
"""

from __future__ import annotations

from dataclasses import dataclass

from repair.errors import BadInput
from repair.hub import client
from repair.hub.errors import hub_call
from repair.hub.spec import HubSpec, check_remote_name

MAX_FILE_BYTES = 1 << 42  # 4 TiB: no checkpoint file is larger, and its sparse mirror must fit (ext4 stops below 16 TiB)
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class RemoteFile:
    """One file at the pinned commit, with what the Hub says of its content."""

    name: str
    size: int
    blob_id: str | None  # git blob sha1 (regular files) / pointer sha1 (LFS)
    sha256: str | None  # LFS files only

    @property
    def is_lfs(self) -> bool:
        return self.sha256 is not None


@dataclass(frozen=True)
class RemoteRepo:
    """A repo pinned to one commit, with its file listing at that commit."""

    repo: str
    asked: str | None  # the revision the user gave (None: default branch)
    sha: str
    files: dict[str, RemoteFile]

    @property
    def label(self) -> str:
        return f"{self.repo}@{self.sha}"

    def visible(self) -> list[str]:
        """Non-hidden file names in local-folder walk order (files before subfolders, each sorted)."""
        names = [n for n in self.files if not (n.startswith(".") or "/." in n)]
        return sorted(names, key=lambda n: tuple((1, p) for p in n.split("/")[:-1]) + ((0, n.split("/")[-1]),))


def resolve(spec: HubSpec) -> RemoteRepo:
    """Pin `spec` to a commit sha and list (and check) every file name at that commit."""
    api = client.api()
    with hub_call(str(spec)):
        sha = api.model_info(spec.repo, revision=spec.revision).sha
    label = f"{spec.repo}@{sha}"
    with hub_call(label):
        entries = list(api.list_repo_tree(spec.repo, revision=sha, recursive=True))
    from huggingface_hub.hf_api import RepoFile

    files = {}
    for entry in entries:
        if isinstance(entry, RepoFile):  # not a folder
            remote = listed_file(entry, label)
            files[remote.name] = remote
    return RemoteRepo(spec.repo, spec.revision, sha, files)


def listed_file(entry, label: str) -> RemoteFile:
    """One file of a listing (a huggingface_hub RepoFile), its name, size and hashes checked: all read from the
    network, where a size `"abc"` or an oid `5` ended in a traceback."""
    name = check_remote_name(entry.path, label)
    lfs = getattr(entry, "lfs", None)
    size, blob_id, sha256 = entry.size, getattr(entry, "blob_id", None), lfs.sha256 if lfs else None
    if type(size) is not int or not 0 <= size <= MAX_FILE_BYTES:
        raise BadInput(f"{label}/{name}: the Hub's listing gives it a size of {size!r}, not a count of bytes; "
                       "nothing was read (is HF_ENDPOINT a Hub?)")
    for kind, value, digits in (("LFS sha256", sha256, 64), ("git blob id", blob_id, 40)):
        if value is not None and not (isinstance(value, str) and len(value) == digits and set(value.lower()) <= _HEX):
            raise BadInput(f"{label}/{name}: the Hub's listing gives it a {kind} of {value!r}, not {digits} hex digits; "
                           "nothing was read (is HF_ENDPOINT a Hub?)")
    return RemoteFile(name, size, blob_id, sha256)
