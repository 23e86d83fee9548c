"""Git-like object ids, LFS pointers and path-pattern helpers (pure stdlib, no git binary).

Ids are computed the way git computes them where it is cheap to do so:

* a regular file's ``oid`` is the git blob sha1 of its content (what the Hub sends as ETag);
* an LFS file's ``oid`` is the git blob sha1 of its LFS *pointer* file, and its ``lfs.oid`` the sha256 of the content;
* a folder's ``oid`` and a commit's ``tree`` are sha1 digests over a flat, sorted ``"<oid> <path>"`` listing
  (git uses nested tree objects; the flat form keeps odd paths such as ``../x`` or ``/abs`` representable);
* a commit id is the sha1 of a git-style commit object (tree, parents, author, date, message).
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
from datetime import datetime, timezone

LFS_POINTER_VERSION = "https://git-lfs.github.com/spec/v1"

# Same spirit as the .gitattributes the Hub writes into every new repo.
DEFAULT_LFS_PATTERNS = (
    "*.7z", "*.arrow", "*.bin", "*.bz2", "*.ckpt", "*.ftz", "*.gz", "*.h5", "*.joblib", "*.lfs.*",
    "*.mlmodel", "*.model", "*.msgpack", "*.npy", "*.npz", "*.onnx", "*.ot", "*.parquet", "*.pb",
    "*.pickle", "*.pkl", "*.pt", "*.pth", "*.rar", "*.safetensors", "saved_model/**/*", "*.tar.*",
    "*.tar", "*.tflite", "*.tgz", "*.wasm", "*.xz", "*.zip", "*.zst", "*tfevents*", "*.gguf",
)
DEFAULT_GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in DEFAULT_LFS_PATTERNS)

# Files above this size always go to LFS, like on the Hub (10 MB).
LFS_SIZE_THRESHOLD = 10 * 1000 * 1000


def now_iso() -> str:
    """UTC timestamp in the Hub's format (``2024-05-01T12:00:00.123Z``)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def git_blob_oid(data: bytes) -> str:
    """Git blob id of ``data`` (sha1 of ``b"blob <len>\\0" + data``)."""
    h = hashlib.sha1(b"blob %d\x00" % len(data))
    h.update(data)
    return h.hexdigest()


def git_blob_oid_of_file(path, size: int, chunk: int = 1 << 20) -> str:
    h = hashlib.sha1(b"blob %d\x00" % size)
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version {LFS_POINTER_VERSION}\noid sha256:{sha256}\nsize {size}\n".encode()


def tree_oid(entries: dict[str, dict], prefix: str = "") -> str:
    """Digest of the entries below ``prefix`` (all entries when ``prefix`` is empty)."""
    h = hashlib.sha1(b"tree\x00")
    for path in sorted(entries):
        if path.startswith(prefix):
            h.update(f"{entries[path]['oid']} {path[len(prefix):]}\n".encode())
    return h.hexdigest()


def commit_oid(*, tree: str, parents: list[str], author: str, date: str, title: str, message: str) -> str:
    lines = [f"tree {tree}"] + [f"parent {p}" for p in parents]
    lines += [f"author {author} <{author}@localhub> {date}", f"committer {author} <{author}@localhub> {date}", ""]
    body = ("\n".join(lines) + "\n" + title + ("\n\n" + message if message else "") + "\n").encode()
    return hashlib.sha1(b"commit %d\x00" % len(body) + body).hexdigest()


def is_hex(value: str, lengths: tuple[int, ...]) -> bool:
    return len(value) in lengths and all(c in "0123456789abcdef" for c in value.lower())


def path_matches(pattern: str, path: str) -> bool:
    """gitattributes/gitignore-style match: a pattern without ``/`` matches the basename anywhere."""
    pattern = pattern.strip()
    if not pattern:
        return False
    if pattern.endswith("/"):  # a folder: everything below it
        folder = pattern.strip("/")
        return path.startswith(folder + "/") or f"/{folder}/" in f"/{path}"
    if "/" not in pattern:
        return fnmatch.fnmatchcase(path.rsplit("/", 1)[-1], pattern)
    return fnmatch.fnmatchcase(path, pattern.lstrip("/").replace("**/", "*"))


def lfs_patterns(gitattributes: str | None) -> list[str]:
    """Patterns tracked by LFS in a .gitattributes text (defaults when the repo has none)."""
    if gitattributes is None:
        return list(DEFAULT_LFS_PATTERNS)
    out = []
    for line in gitattributes.splitlines():
        parts = line.split()
        if len(parts) >= 2 and not parts[0].startswith("#") and "filter=lfs" in parts[1:]:
            out.append(parts[0])
    return out


def wants_lfs(path: str, size: int, sample: bytes, patterns: list[str]) -> bool:
    """The Hub's upload-mode rule: LFS if tracked by .gitattributes, large, or binary-looking."""
    if size == 0:
        return False
    if size >= LFS_SIZE_THRESHOLD or b"\x00" in sample[:512]:
        return True
    return any(path_matches(p, path) for p in patterns)


def is_ignored(path: str, gitignore: str | None) -> bool:
    if not gitignore:
        return False
    ignored = False
    for line in gitignore.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        if path_matches(line[1:] if negate else line, path):
            ignored = not negate
    return ignored


def b64decode(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=False)
