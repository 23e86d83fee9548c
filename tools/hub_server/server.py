"""``LocalHub``: a Hub-compatible HTTP server on 127.0.0.1 for running the real ``huggingface_hub`` client
offline, plus the test-side helpers (request log, fixtures, fault injection, assertions)."""

from __future__ import annotations

import logging
import socket
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

from . import access, discussions, gitobj, routes_discussions, routes_read, routes_upload, routes_write
from .errors import HubError, repo_not_found
from .httpbase import HubRequestHandler, RequestRecord, UploadFault
from .store import Store

logger = logging.getLogger("tools.hub_server")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def handle_error(self, request, client_address):  # client hang-ups are normal in fault tests
        logger.debug("LocalHub connection error from %s", client_address, exc_info=True)


class LocalHub:
    """A local Hub on ``127.0.0.1:<free port>``; use as a context manager (``with LocalHub(tmp) as hub:``).

    Tunables (plain attributes, change them before the requests they should affect):
    ``tree_page_size`` (1000, the Hub's; 50 with ``expand``), ``commits_page_size`` (50),
    ``multipart_threshold`` / ``multipart_chunk_size`` (LFS objects larger than the threshold are uploaded
    in parts of that size).
    """

    tree_page_size = 1000
    commits_page_size = 50
    multipart_threshold = 64 * 1024 * 1024
    multipart_chunk_size = 16 * 1024 * 1024

    def __init__(self, root: Path, *, token: str = "hf_localtest_token", user: str = "alice",
                 orgs: dict[str, str] | None = None):
        self.root = Path(root)
        self.token, self.user = token, user
        self.orgs = dict(orgs or {})  # the user's organizations: name -> role (admin | write | contributor | read)
        self._grants = {token: access.Grant(user, "write")}
        self.store = Store(self.root)
        self._lock = threading.Lock()
        self._log: list[RequestRecord] = []
        self._faults: list[UploadFault] = []
        self._uploads: dict[str, dict] = {}
        self._conns: set[socket.socket] = set()
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "LocalHub":
        if self._httpd is None:
            self._httpd = _Server(("127.0.0.1", 0), HubRequestHandler)
            self._httpd.hub = self
            self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                            name="LocalHub", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            with self._lock:  # drop kept-alive client connections so nothing is served after stop()
                conns, self._conns = list(self._conns), set()
            for conn in conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._thread.join(timeout=5)
            self._httpd = self._thread = None

    def __enter__(self) -> "LocalHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def endpoint(self) -> str:
        if self._httpd is None:
            raise RuntimeError("LocalHub is not running (use it as a context manager or call start())")
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def _track(self, conn: socket.socket, alive: bool) -> None:
        with self._lock:
            (self._conns.add if alive else self._conns.discard)(conn)

    # ------------------------------------------------------------ tokens
    def add_token(self, token: str, *, role: str = "write", user: str | None = None) -> None:
        """Another token, with a classic role: "write" or "read" (see access.py); of the user, or of another
        account `user` (which sees its own namespace's private repos, not the user's)."""
        if role not in ("write", "read"):
            raise ValueError(f"role must be 'write' or 'read', not {role!r}")
        with self._lock:
            self._grants[token] = access.Grant(user or self.user, role)

    def grant_for(self, token: str) -> "access.Grant | None":
        with self._lock:
            return self._grants.get(token)

    def namespaces(self, user: str) -> set[str]:
        """Where `user` may create and change repos: its own namespace and its organizations with a writer role."""
        return {user} | {org for org, role in self.orgs.items() if role in access.WRITER_ROLES}

    # ------------------------------------------------------------ request log
    @property
    def requests(self) -> list[RequestRecord]:
        """Snapshot of every request so far, in the order they completed."""
        with self._lock:
            return list(self._log)

    def clear_log(self) -> None:
        with self._lock:
            self._log.clear()

    def _record(self, record: RequestRecord) -> None:
        with self._lock:
            self._log.append(record)

    # ------------------------------------------------------------ fault injection
    def fail_uploads_after(self, n_bytes: int, *, status: int | None = None, times: int = 1) -> None:
        """Make the next ``times`` upload requests fail after reading ``n_bytes`` of their body.

        Uploads are LFS PUTs (single or multipart part) and commit POSTs (which carry regular files inline).
        ``status=None`` resets the connection; otherwise the server answers ``status`` and closes it.
        Note the client retries LFS PUTs on resets and 5xx (up to 5 retries, sleeping 1, 2, 4, 8, 8 s), so
        ``times=1`` there is recovered transparently; the commit POST is never retried by the client.
        """
        with self._lock:
            self._faults.extend(UploadFault(int(n_bytes), status) for _ in range(times))

    def _take_fault(self) -> UploadFault | None:
        with self._lock:
            return self._faults.pop(0) if self._faults else None

    # ------------------------------------------------------------ fixtures
    def add_repo(self, repo_id: str, folder: Path, *, message: str = "initial", private: bool = False) -> str:
        """Create a model repo whose first commit holds exactly the files below ``folder``; returns its sha.

        LFS vs regular follows the Hub's rule (``folder/.gitattributes`` or the default patterns, size, binary).
        """
        if self.store.get(repo_id) is not None:
            raise ValueError(f"repo {repo_id} already exists")
        folder = Path(folder)
        attributes = folder / ".gitattributes"
        patterns = gitobj.lfs_patterns(attributes.read_text() if attributes.is_file() else None)
        tree = {}
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            rel = path.relative_to(folder).as_posix()
            if rel.split("/")[0] == ".git":
                continue
            data = path.read_bytes()
            tree[rel] = self.store.entry_for_bytes(data, lfs=gitobj.wants_lfs(rel, len(data), data[:512], patterns))
        with self.store.lock:
            repo = self.store.create(repo_id, private=private, author=self.user, tree=tree, title=message)
            return repo["refs"]["refs/heads/main"]

    def add_raw_file(self, repo_id: str, path: str, data: bytes, *, revision: str = "main",
                     lfs: bool | None = None, message: str | None = None) -> str:
        """Commit one file under ``path`` *verbatim* (``../x``, ``/abs`` ... are not checked); returns the sha.

        Creates the repo (empty, public) when missing. ``lfs=None`` applies the Hub's LFS rule.
        """
        if lfs is None:
            lfs = gitobj.wants_lfs(path, len(data), data[:512], gitobj.lfs_patterns(None))
        entry = self.store.entry_for_bytes(data, lfs=lfs)
        with self.store.lock:
            repo = self.store.get(repo_id) or self.store.create(repo_id, private=False, author=self.user, tree={})
            hit = self.store.resolve(repo, revision)
            if hit is None or hit[1] is None or not hit[1].startswith(("refs/heads/", "refs/pr/")):
                raise KeyError(f"{revision!r} is not a branch of {repo_id}")
            tree = dict(self.store.tree(repo, hit[0]))
            tree[path] = entry
            sha = self.store.add_commit(repo, parents=[hit[0]], tree=tree, author=self.user,
                                        title=message or f"Add {path}", message="")
            repo["refs"][hit[1]] = sha
            self.store.save(repo)
            return sha

    # ------------------------------------------------------------ assertions
    def _snapshot(self, repo_id: str, revision: str) -> tuple[dict, str]:
        with self.store.lock:
            repo = self.store.get(repo_id)
            if repo is None:
                raise KeyError(f"no repo {repo_id}")
            hit = self.store.resolve(repo, revision)
            if hit is None:
                raise KeyError(f"no revision {revision!r} in {repo_id}")
            return repo, hit[0]

    def head(self, repo_id: str, revision: str = "main") -> str:
        """Commit sha a revision (branch, tag, ``refs/pr/N``, sha) points to."""
        return self._snapshot(repo_id, revision)[1]

    def repo_files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        repo, sha = self._snapshot(repo_id, revision)
        return {path: self.store.file_bytes(entry) for path, entry in sorted(self.store.tree(repo, sha).items())}

    def discussions(self, repo_id: str) -> list[dict]:
        """PRs and discussions, oldest first: num, title, status, is_pull_request, ref, head, description, ..."""
        with self.store.lock:
            repo = self.store.get(repo_id)
            if repo is None:
                raise KeyError(f"no repo {repo_id}")
            return [discussions.for_assertions(repo, d) for d in repo["discussions"]]

    # ------------------------------------------------------------ routing
    def _dispatch(self, h) -> None:
        s, m = h.segs, h.method
        if s[:1] == ["api"]:
            tail = s[1:]
            if tail == ["whoami-v2"] and m == "GET":
                return routes_write.whoami(h)
            if len(tail) == 2 and tail[0] == "repos" and m in ("POST", "DELETE"):
                return routes_write.repos_action(h, tail[1])
            if tail == ["models"] and m == "GET":
                return routes_read.list_models(h)
            if tail == ["validate-yaml"] and m == "POST":
                return routes_write.validate_yaml(h)
            if len(tail) >= 2 and tail[0] in ("models", "datasets", "spaces"):
                if tail[0] != "models" or len(tail) == 2:
                    raise repo_not_found("/".join(tail[1:3]))
                return self._dispatch_repo(h, f"{tail[1]}/{tail[2]}", tail[3:])
        elif s[:1] == ["__lfs"]:
            return routes_upload.lfs_target(h, s[1:])
        elif len(s) >= 4 and s[2] == "resolve" and m in ("GET", "HEAD"):
            return routes_read.resolve_file(h, f"{s[0]}/{s[1]}", s[3:])
        elif len(s) == 6 and s[1].endswith(".git") and s[2:] == ["info", "lfs", "objects", "batch"] and m == "POST":
            return routes_upload.lfs_batch(h, f"{s[0]}/{s[1][:-4]}")
        raise HubError(404, f"LocalHub has no route for {m} {h.path.partition('?')[0]}")

    def _dispatch_repo(self, h, repo_id: str, rest: list[str]) -> None:
        m, head, args = h.method, (rest[0] if rest else ""), rest[1:]
        get, post = m in ("GET", "HEAD"), m == "POST"
        if not rest and get:
            return routes_read.info(h, repo_id, None)
        if head == "revision" and args and get:
            return routes_read.info(h, repo_id, routes_read.take_rev(args)[0])
        if head == "tree" and args and get:
            return routes_read.tree(h, repo_id, args)
        if head == "paths-info" and args and post:
            return routes_read.paths_info(h, repo_id, args)
        if head == "refs" and not args and get:
            return routes_read.refs(h, repo_id)
        if head == "commits" and args and get:
            return routes_read.commits(h, repo_id, args)
        if head == "safetensors-metadata" and get:
            return routes_read.safetensors_metadata(h, repo_id, args)
        if head == "preupload" and args and post:
            return routes_upload.preupload(h, repo_id, args)
        if head == "commit" and args and post:
            return routes_upload.commit(h, repo_id, args)
        if head == "auth-check" and args in ([], ["write"]) and get:
            return routes_write.auth_check(h, repo_id, args)
        if head == "duplicate" and not args and post:
            return routes_write.duplicate(h, repo_id)
        if head == "settings" and not args and m == "PUT":
            return routes_write.settings(h, repo_id)
        if head == "branch" and args and m in ("POST", "DELETE"):
            return routes_write.branch(h, repo_id, "/".join(args))
        if head == "tag" and args and m in ("POST", "DELETE"):
            return routes_write.tag(h, repo_id, routes_read.take_rev(args)[0])
        if head.startswith("xet-") and head.endswith("-token"):
            raise HubError(404, "LocalHub has no Xet storage: set HF_HUB_DISABLE_XET=1 before importing huggingface_hub")
        if head == "discussions" and not args:
            return routes_discussions.root(h, repo_id)
        if head == "discussions" and len(args) in (1, 2):
            return routes_discussions.one(h, repo_id, args[0], args[1] if len(args) == 2 else None)
        raise HubError(404, f"LocalHub has no route for {m} /api/models/{repo_id}/{'/'.join(rest)}")
