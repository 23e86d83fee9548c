"""The real huggingface_hub client against tools.hub_server.LocalHub (127.0.0.1 only, no network)."""

import os

os.environ["HF_HUB_DISABLE_XET"] = "1"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
os.environ.pop("HF_HUB_OFFLINE", None)
os.environ.pop("TRANSFORMERS_OFFLINE", None)

import base64  # noqa: E402
import json  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import httpx2  # noqa: E402 - the installed client's HTTP library
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from huggingface_hub import (  # noqa: E402
    CommitOperationAdd,
    CommitOperationDelete,
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
)
from huggingface_hub.errors import (  # noqa: E402
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder  # noqa: E402
from huggingface_hub.utils import disable_progress_bars  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from tools.hub_server import LocalHub, RequestRecord  # noqa: E402

REPO = "alice/src-model"


@pytest.fixture(autouse=True)
def _client_env(monkeypatch, tmp_path):
    # In case huggingface_hub was imported (by another test module) before the env vars above were set.
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "default-cache"))
    with disable_progress_bars():
        yield


@pytest.fixture
def hub(tmp_path):
    with LocalHub(tmp_path / "hub") as h:
        yield h


@pytest.fixture
def api(hub):
    return HfApi(endpoint=hub.endpoint, token=hub.token)


def _st_bytes(tmp_path: Path, name: str, tensors: dict) -> Path:
    path = tmp_path / name
    save_file(tensors, str(path), metadata={"format": "pt"})
    return path


@pytest.fixture
def src_folder(tmp_path):
    folder = tmp_path / "src"
    (folder / "sub").mkdir(parents=True)
    (folder / "config.json").write_text('{"model_type": "gemma"}')
    (folder / "sub" / "notes.txt").write_text("hello\n")
    save_file({"w": np.arange(100_000, dtype=np.float32), "b": np.zeros((4, 2), dtype=np.float16)},
              str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def _raw(hub, method, path, *, body=None, headers=None, token=True):
    """A stdlib request to the hub: (status, headers, body bytes)."""
    headers = dict(headers or {})
    if token:
        headers["Authorization"] = f"Bearer {hub.token}"
    req = urllib.request.Request(hub.endpoint + path, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


# --------------------------------------------------------------------------- reads
def test_model_info_tree_commits_refs(hub, api, src_folder):
    sha = hub.add_repo(REPO, src_folder)
    assert len(sha) == 40
    info = api.model_info(REPO)
    assert info.sha == sha and info.id == REPO
    assert api.model_info(REPO, revision="main").sha == sha
    assert api.model_info(REPO, revision=sha).sha == sha
    assert info.safetensors.total == 100_008 and info.safetensors.parameters == {"F32": 100_000, "F16": 8}

    meta = {s.rfilename: s for s in api.model_info(REPO, files_metadata=True).siblings}
    assert set(meta) == {"config.json", "model.safetensors", "sub/notes.txt"}
    assert meta["config.json"].lfs is None and meta["config.json"].size == len('{"model_type": "gemma"}')
    st = meta["model.safetensors"]
    assert st.lfs is not None and st.lfs.size == st.size == (src_folder / "model.safetensors").stat().st_size

    assert sorted(api.list_repo_files(REPO)) == ["config.json", "model.safetensors", "sub/notes.txt"]
    entries = list(api.list_repo_tree(REPO, recursive=True))
    assert {e.path for e in entries if isinstance(e, RepoFolder)} == {"sub"}
    files = {e.path: e for e in entries if isinstance(e, RepoFile)}
    assert files["model.safetensors"].lfs.sha256 == st.lfs.sha256
    assert {e.path for e in api.list_repo_tree(REPO)} == {"config.json", "model.safetensors", "sub"}
    expanded = list(api.list_repo_tree(REPO, path_in_repo="sub", expand=True))
    assert [e.path for e in expanded] == ["sub/notes.txt"] and expanded[0].last_commit.oid == sha

    hub.tree_page_size = 1  # exercise Link: rel="next" pagination
    hub.clear_log()
    assert len(list(api.list_repo_tree(REPO, recursive=True))) == 4
    assert sum(r.path.startswith(f"/api/models/{REPO}/tree/") for r in hub.requests) == 4

    paths = {p.path: p for p in api.get_paths_info(REPO, ["config.json", "sub", "missing"])}
    assert isinstance(paths["sub"], RepoFolder) and isinstance(paths["config.json"], RepoFile)

    second = api.upload_file(path_or_fileobj=b"v2", path_in_repo="config.json", repo_id=REPO,
                             commit_message="second").oid
    commits = api.list_repo_commits(REPO)
    assert [c.commit_id for c in commits] == [second, sha]
    assert commits[0].title == "second" and commits[0].authors == ["alice"]
    api.create_branch(REPO, branch="dev", revision=sha)
    api.create_tag(REPO, tag="v1", revision=sha)
    refs = api.list_repo_refs(REPO)
    assert {b.name: b.target_commit for b in refs.branches} == {"main": second, "dev": sha}
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1", sha)]
    assert api.model_info(REPO, revision="dev").sha == sha
    assert api.model_info(REPO, revision=sha[:10]).sha == sha  # short shas resolve too


def test_hf_hub_download_small_lfs_branch_and_pinned(hub, src_folder, tmp_path):
    sha = hub.add_repo(REPO, src_folder)
    kw = dict(endpoint=hub.endpoint, token=False)
    for name in ("config.json", "model.safetensors", "sub/notes.txt"):
        got = hf_hub_download(REPO, name, cache_dir=tmp_path / "c1", **kw)
        assert Path(got).read_bytes() == (src_folder / name).read_bytes()

    meta = get_hf_file_metadata(hf_hub_url(REPO, "model.safetensors", endpoint=hub.endpoint), token=False)
    assert meta.commit_hash == sha and meta.size == (src_folder / "model.safetensors").stat().st_size
    assert meta.etag == api_sibling_sha256(hub, "model.safetensors")  # LFS: X-Linked-Etag = sha256
    small = get_hf_file_metadata(hf_hub_url(REPO, "config.json", endpoint=hub.endpoint), token=False)
    assert len(small.etag) == 40 and small.commit_hash == sha  # regular file: git blob sha1

    HfApi(endpoint=hub.endpoint, token=hub.token).upload_file(
        path_or_fileobj=b'{"model_type": "v2"}', path_in_repo="config.json", repo_id=REPO, commit_message="v2")
    hub.clear_log()
    pinned = hf_hub_download(REPO, "config.json", revision=sha, cache_dir=tmp_path / "c2", **kw)
    assert Path(pinned).read_bytes() == (src_folder / "config.json").read_bytes()
    assert Path(hf_hub_download(REPO, "config.json", cache_dir=tmp_path / "c2", **kw)).read_bytes() == \
        b'{"model_type": "v2"}'
    lfs_pinned = hf_hub_download(REPO, "model.safetensors", revision=sha, cache_dir=tmp_path / "c3", **kw)
    assert Path(lfs_pinned).read_bytes() == (src_folder / "model.safetensors").read_bytes()
    methods = [(r.method, r.path.rsplit("/", 1)[-1]) for r in hub.requests]
    assert methods[:2] == [("HEAD", "config.json"), ("GET", "config.json")]
    assert all(r.status == 200 for r in hub.requests)

    snap = Path(snapshot_download(REPO, revision=sha, cache_dir=tmp_path / "c4", **kw))
    assert (snap / "sub" / "notes.txt").read_text() == "hello\n" and snap.name == sha
    api = HfApi(endpoint=hub.endpoint, token=False)
    assert api.file_exists(REPO, "sub/notes.txt") and not api.file_exists(REPO, "nope.txt")
    assert api.revision_exists(REPO, sha) and not api.revision_exists(REPO, "nope")


def api_sibling_sha256(hub, path):
    return hub.store.tree(hub.store.get(REPO), hub.head(REPO))[path]["sha256"]


def test_range_requests(hub, src_folder):
    hub.add_repo(REPO, src_folder)
    data = (src_folder / "model.safetensors").read_bytes()
    url = f"/{REPO}/resolve/main/model.safetensors"
    status, headers, body = _raw(hub, "GET", url, headers={"Range": "bytes=8-99"}, token=False)
    assert (status, body) == (206, data[8:100])
    assert headers["Content-Range"] == f"bytes 8-99/{len(data)}" and headers["X-Repo-Commit"] == hub.head(REPO)
    assert headers["X-Linked-Size"] == str(len(data)) and headers["Accept-Ranges"] == "bytes"
    assert _raw(hub, "GET", url, headers={"Range": "bytes=-10"}, token=False)[2] == data[-10:]
    assert _raw(hub, "GET", url, headers={"Range": f"bytes={len(data) - 5}-"}, token=False)[2] == data[-5:]
    status, headers, _ = _raw(hub, "GET", url, headers={"Range": f"bytes={len(data)}-"}, token=False)
    assert status == 416 and headers["Content-Range"] == f"bytes */{len(data)}"
    status, headers, body = _raw(hub, "GET", f"/{REPO}/resolve/main/config.json", headers={"Range": "bytes=2-5"},
                                 token=False)
    assert (status, body, headers["Content-Range"]) == (206, b"mode", "bytes 2-5/23")
    assert _raw(hub, "GET", url, token=False)[:1] == (200,)
    assert [r.range for r in hub.requests][:2] == ["bytes=8-99", "bytes=-10"]


def test_get_safetensors_metadata_single_and_sharded(hub, api, src_folder, tmp_path):
    hub.add_repo(REPO, src_folder)
    single = api.get_safetensors_metadata(REPO)
    assert not single.sharded and single.files_metadata["model.safetensors"].tensors["w"].shape == [100_000]

    sharded = tmp_path / "sharded"
    sharded.mkdir()
    weight_map = {}
    for i in (1, 2):
        name = f"model-0000{i}-of-00002.safetensors"
        save_file({f"layer{i}.w": np.ones(200_000, dtype=np.float32)}, str(sharded / name), metadata={"format": "pt"})
        weight_map[f"layer{i}.w"] = name
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 1_600_000},
                                                                       "weight_map": weight_map}))
    hub.add_repo("alice/sharded", sharded)
    hub.clear_log()
    meta = api.get_safetensors_metadata("alice/sharded")
    assert meta.sharded and meta.weight_map == weight_map and meta.metadata == {"total_size": 1_600_000}
    assert meta.files_metadata["model-00002-of-00002.safetensors"].tensors["layer2.w"].dtype == "F32"
    shard_gets = [r for r in hub.requests if r.method == "GET" and r.path.endswith(".safetensors")]
    assert len(shard_gets) == 2 and all(r.range is not None and r.status == 206 for r in shard_gets)
    assert not [r for r in hub.requests if r.path.endswith(".safetensors") and r.method == "GET" and r.range is None]

    if hasattr(api, "get_sharded_safetensors_metadata"):  # server-side parsed headers, one request
        hub.clear_log()
        fast = api.get_sharded_safetensors_metadata("alice/sharded")
        assert fast.weight_map == weight_map and len(hub.requests) == 1


# -------------------------------------------------------------------------- errors
def test_errors_map_to_client_exceptions(hub, api, src_folder, tmp_path):
    hub.add_repo(REPO, src_folder)
    kw = dict(endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("alice/nope")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("alice/nope", "config.json", **kw)
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(REPO, "config.json", revision="f" * 40, **kw)
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(REPO, "missing.json", **kw)
    with pytest.raises(EntryNotFoundError):
        list(api.list_repo_tree(REPO, path_in_repo="no/dir"))
    codes = {r.status for r in hub.requests}
    assert codes == {404}
    status, headers, _ = _raw(hub, "HEAD", f"/{REPO}/resolve/main/missing.json", token=False)
    assert status == 404 and headers["X-Error-Code"] == "EntryNotFound" and headers["X-Repo-Commit"]
    assert _raw(hub, "GET", "/api/models/alice/nope")[1]["X-Error-Code"] == "RepoNotFound"
    assert _raw(hub, "GET", f"/api/models/{REPO}/revision/nope")[1]["X-Error-Code"] == "RevisionNotFound"

    api.create_repo("alice/secret", private=True)
    anon = HfApi(endpoint=hub.endpoint, token=False)
    with pytest.raises(RepositoryNotFoundError):
        anon.model_info("alice/secret")
    with pytest.raises(RepositoryNotFoundError):
        hf_hub_download("alice/secret", ".gitattributes", **kw)
    assert hub.requests[-1].status == 401
    assert api.model_info("alice/secret").private is True
    assert [m.id for m in anon.list_models(author="alice")] == [REPO]
    api.update_repo_settings("alice/secret", private=False)
    assert anon.model_info("alice/secret").private is False
    with pytest.raises(HfHubHTTPError) as err:  # writes need the token
        anon.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO)
    assert err.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as err:
        HfApi(endpoint=hub.endpoint, token="hf_wrong").whoami()
    assert err.value.response.status_code == 401


# ----------------------------------------------------------------------- repo admin
def test_create_repo_exist_ok_duplicate_whoami(hub, api, src_folder):
    assert api.whoami()["name"] == "alice"
    url = api.create_repo("alice/new")
    assert url.repo_id == "alice/new" and api.list_repo_files("alice/new") == [".gitattributes"]
    assert api.create_repo("alice/new", exist_ok=True).repo_id == "alice/new"
    assert hub.requests[-1].status == 409
    with pytest.raises(HfHubHTTPError) as err:
        api.create_repo("alice/new")
    assert err.value.response.status_code == 409

    src_sha = hub.add_repo(REPO, src_folder)
    fork = api.duplicate_repo(REPO, "alice/fork")
    assert fork.repo_id == "alice/fork"
    assert hub.repo_files("alice/fork") == hub.repo_files(REPO) and hub.head("alice/fork") == src_sha
    assert api.model_info("alice/fork", revision=src_sha).sha == src_sha  # pinned source sha exists in the fork
    with pytest.raises(HfHubHTTPError):
        api.duplicate_repo(REPO, "alice/fork")
    assert api.duplicate_repo(REPO, "alice/fork", exist_ok=True).repo_id == "alice/fork"
    api.delete_repo("alice/new")
    assert not api.repo_exists("alice/new")


# ------------------------------------------------------------------------- commits
def test_create_commit_regular_lfs_delete_and_skips(hub, api, tmp_path):
    api.create_repo("alice/out")
    big = tmp_path / "w.safetensors"
    big.write_bytes(b"\x01" * 5000)
    info = api.create_commit("alice/out", commit_message="add", operations=[
        CommitOperationAdd("config.json", b'{"a": 1}'),
        CommitOperationAdd("w.safetensors", big),
        CommitOperationAdd("dir/a.txt", b"a"), CommitOperationAdd("dir/b.txt", b"b"),
        *[CommitOperationAdd(f"shards/{i}.bin", bytes([i]) * 3000) for i in range(4)],  # parallel PUTs
    ])
    assert info.oid == hub.head("alice/out") and info.pr_url is None
    files = hub.repo_files("alice/out")
    assert files["w.safetensors"] == big.read_bytes() and files["config.json"] == b'{"a": 1}'
    assert [r.status for r in hub.requests if r.path.startswith("/__lfs/upload/")] == [200] * 5
    assert all(files[f"shards/{i}.bin"] == bytes([i]) * 3000 for i in range(4))
    tree = {e.path: e for e in api.list_repo_tree("alice/out", recursive=True)}
    assert tree["w.safetensors"].lfs is not None and tree["config.json"].lfs is None

    hub.clear_log()
    second = api.create_commit("alice/out", commit_message="copy + delete", operations=[
        CommitOperationAdd("copy.safetensors", big),  # same oid: the LFS batch answers "already stored"
        CommitOperationAdd("config.json", b'{"a": 1}'),  # unchanged: the client drops it (preupload oid)
        CommitOperationDelete("dir/"), CommitOperationDelete("w.safetensors"), CommitOperationDelete("shards/"),
    ])
    assert not [r for r in hub.requests if r.method == "PUT"]
    assert sorted(hub.repo_files("alice/out")) == [".gitattributes", "config.json", "copy.safetensors"]
    assert api.list_repo_commits("alice/out")[0].commit_id == second.oid

    hub.clear_log()
    same = api.create_commit("alice/out", commit_message="noop",
                             operations=[CommitOperationAdd("config.json", b'{"a": 1}')])
    assert same.oid == second.oid and not [r for r in hub.requests if "/commit/" in r.path]
    with pytest.raises(EntryNotFoundError):
        api.create_commit("alice/out", commit_message="bad", operations=[CommitOperationDelete("nope.txt")])
    assert hub.head("alice/out") == second.oid


def test_multipart_lfs_upload(hub, api):
    api.create_repo("alice/mp")
    hub.multipart_threshold, hub.multipart_chunk_size = 1000, 400
    data = bytes(range(256)) * 10
    api.upload_file(path_or_fileobj=data, path_in_repo="big.bin", repo_id="alice/mp")
    assert hub.repo_files("alice/mp")["big.bin"] == data
    assert sum(r.path.startswith("/__lfs/part/") for r in hub.requests) == 7
    assert [r.status for r in hub.requests if r.path.startswith("/__lfs/complete/")] == [200]


def test_parent_commit_and_pull_requests(hub, api, src_folder):
    base = hub.add_repo(REPO, src_folder)
    moved = api.upload_file(path_or_fileobj=b"x", path_in_repo="x.txt", repo_id=REPO, parent_commit=base).oid
    with pytest.raises(HfHubHTTPError) as err:
        api.upload_file(path_or_fileobj=b"y", path_in_repo="y.txt", repo_id=REPO, parent_commit=base)
    assert err.value.response.status_code == 412 and hub.head(REPO) == moved

    pr = api.create_commit(REPO, commit_message="Fix scales", commit_description="why", create_pr=True,
                           parent_commit=base, operations=[CommitOperationAdd("config.json", b"{}")])
    assert pr.pr_num == 1 and pr.pr_url.endswith("/discussions/1") and pr.pr_revision == "refs/pr/1"
    assert hub.head(REPO) == moved  # main untouched
    [disc] = hub.discussions(REPO)
    assert (disc["title"], disc["status"], disc["is_pull_request"], disc["ref"]) == ("Fix scales", "open", True,
                                                                                    "refs/pr/1")
    assert disc["base_commit"] == base and disc["head"] == pr.oid == hub.head(REPO, "refs/pr/1")
    assert hub.repo_files(REPO, "refs/pr/1")["config.json"] == b"{}" and "x.txt" not in hub.repo_files(REPO, pr.oid)
    more = api.upload_file(path_or_fileobj=b"z", path_in_repo="z.txt", repo_id=REPO, revision="refs/pr/1")
    assert hub.head(REPO, "refs/pr/1") == more.oid
    prs = api.list_repo_refs(REPO, include_pull_requests=True).pull_requests
    assert [(p.ref, p.target_commit) for p in prs] == [("refs/pr/1", more.oid)]
    details = api.get_discussion_details(REPO, 1)
    assert [e.type for e in details.events] == ["comment", "commit", "commit"] and "z.txt" in details.diff
    api.merge_pull_request(REPO, 1)
    files = hub.repo_files(REPO)
    assert files["config.json"] == b"{}" and files["x.txt"] == b"x" and files["z.txt"] == b"z"
    assert hub.discussions(REPO)[0]["status"] == "merged"


def test_upload_folder_file_and_readme_yaml(hub, api, src_folder):
    api.create_repo("alice/up")
    api.upload_folder(folder_path=src_folder, repo_id="alice/up")
    files = hub.repo_files("alice/up")
    assert files["sub/notes.txt"] == b"hello\n" and files["model.safetensors"] == \
        (src_folder / "model.safetensors").read_bytes()
    hub.clear_log()
    card = b"---\nbase_model: alice/src-model\ntags:\n- nvfp4\n---\n# Fixed\n"
    api.upload_file(path_or_fileobj=card, path_in_repo="README.md", repo_id="alice/up")
    assert [r.path for r in hub.requests][0] == "/api/validate-yaml" and hub.repo_files("alice/up")["README.md"] == card
    info = api.model_info("alice/up")
    assert info.card_data.base_model == "alice/src-model" and info.tags == ["nvfp4"]
    with pytest.raises(ValueError, match="Invalid metadata"):
        api.upload_file(path_or_fileobj=b"---\nbase_model: x\n", path_in_repo="README.md", repo_id="alice/up")
    pr = api.upload_folder(folder_path=src_folder / "sub", path_in_repo="docs", repo_id="alice/up", create_pr=True)
    assert pr.pr_num == 1 and "docs/notes.txt" in hub.repo_files("alice/up", "refs/pr/1")
    assert "docs/notes.txt" not in hub.repo_files("alice/up")


def test_discussions_api(hub, api, src_folder):
    hub.add_repo(REPO, src_folder)
    d = api.create_discussion(REPO, title="Scales look wrong", description="see layer 3")
    p = api.create_pull_request(REPO, title="Empty PR", description="draft")
    assert (d.num, d.is_pull_request, d.status) == (1, False, "open")
    assert (p.num, p.is_pull_request, p.status, p.git_reference) == (2, True, "draft", "refs/pr/2")
    c = api.comment_discussion(REPO, 1, "confirmed")
    assert c.content == "confirmed"
    status = api.change_discussion_status(REPO, 1, "closed", comment="fixed upstream")
    assert status.new_status == "closed"
    listed = list(api.get_repo_discussions(REPO))
    assert [(x.num, x.title, x.status, x.is_pull_request) for x in listed] == [
        (2, "Empty PR", "draft", True), (1, "Scales look wrong", "closed", False)]
    assert [x.num for x in api.get_repo_discussions(REPO, discussion_type="pull_request")] == [2]
    details = api.get_discussion_details(REPO, 1)
    assert [e.type for e in details.events] == ["comment", "comment", "comment", "status-change"]
    assert api.get_discussion_details(REPO, 2).target_branch == "refs/heads/main"
    assert api.rename_discussion(REPO, 2, "Better title").new_title == "Better title"
    assert hub.discussions(REPO)[0]["comments"] == ["confirmed", "fixed upstream"]
    with pytest.raises(HfHubHTTPError):
        HfApi(endpoint=hub.endpoint, token=False).comment_discussion(REPO, 1, "anon")


# ------------------------------------------------------------------ fault injection
def test_failed_commit_upload_leaves_branch_unchanged(hub, api, monkeypatch, tmp_path):
    api.create_repo("alice/f")
    before = hub.head("alice/f")
    ops = lambda: [CommitOperationAdd("a.txt", b"a" * 2000)]  # noqa: E731 - regular file, sent inline
    hub.fail_uploads_after(100)
    with pytest.raises(httpx2.TransportError):  # ReadError: connection reset by peer
        api.create_commit("alice/f", operations=ops(), commit_message="c")
    assert hub.head("alice/f") == before and hub.requests[-1].status == 0  # connection reset, no retry
    hub.fail_uploads_after(100, status=500)
    with pytest.raises(HfHubHTTPError):
        api.create_commit("alice/f", operations=ops(), commit_message="c")
    assert hub.head("alice/f") == before
    assert api.create_commit("alice/f", operations=ops(), commit_message="c").oid == hub.head("alice/f") != before

    # LFS PUTs are retried by the client (http_backoff); skip its sleeps to keep the test fast.
    from huggingface_hub.utils import _http

    sleeps = []
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=sleeps.append))
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(b"\x02" * 4000)
    before = hub.head("alice/f")
    hub.fail_uploads_after(1000, times=6)  # initial try + 5 retries
    with pytest.raises(RuntimeError, match="Error while uploading"):
        api.upload_file(path_or_fileobj=weights, path_in_repo="w.safetensors", repo_id="alice/f")
    assert hub.head("alice/f") == before and "w.safetensors" not in hub.repo_files("alice/f")
    assert len(sleeps) == 5 and not list((hub.root / "tmp").glob("lfs-*"))
    api.upload_file(path_or_fileobj=weights, path_in_repo="w.safetensors", repo_id="alice/f")
    assert hub.repo_files("alice/f")["w.safetensors"] == weights.read_bytes()

    hub.fail_uploads_after(10)  # a single reset on an LFS PUT is absorbed by the client's retry
    sleeps.clear()
    api.upload_file(path_or_fileobj=b"\x03" * 3000, path_in_repo="w2.safetensors", repo_id="alice/f")
    puts = [r.status for r in hub.requests if r.path.startswith("/__lfs/upload/")]
    assert puts[-2:] == [0, 200] and sleeps == [1]


# --------------------------------------------------------------------- odd paths
def test_raw_paths_are_stored_verbatim(hub, api, src_folder, tmp_path):
    hub.add_repo(REPO, src_folder)
    hub.add_raw_file(REPO, "../escape.txt", b"evil")
    sha = hub.add_raw_file(REPO, "/abs/path.bin", b"\x00evil", lfs=True)
    assert {"../escape.txt", "/abs/path.bin"} <= set(api.list_repo_files(REPO))
    assert {"../escape.txt", "/abs/path.bin"} <= {s.rfilename for s in api.model_info(REPO).siblings}
    assert hub.repo_files(REPO, sha)["/abs/path.bin"] == b"\x00evil"
    with pytest.raises(ValueError):  # the client refuses to materialise it; the tool must not rely on that alone
        hf_hub_download(REPO, "../escape.txt", endpoint=hub.endpoint, token=False, cache_dir=tmp_path / "c")
    line = json.dumps({"key": "file", "value": {"path": "../../etc/x", "encoding": "base64",
                                                "content": base64.b64encode(b"raw").decode()}})
    header = json.dumps({"key": "header", "value": {"summary": "raw commit"}})
    status, _, body = _raw(hub, "POST", f"/api/models/{REPO}/commit/main", body=f"{header}\n{line}\n".encode(),
                           headers={"Content-Type": "application/x-ndjson"})
    assert status == 200 and hub.repo_files(REPO)["../../etc/x"] == b"raw"
    assert json.loads(body)["commitOid"] == hub.head(REPO)


# ------------------------------------------------------------------ log & restart
def test_request_log_and_persistence(tmp_path, src_folder):
    with LocalHub(tmp_path / "hub", token="hf_other", user="bob") as hub:
        assert hub.endpoint.startswith("http://127.0.0.1:")
        sha = hub.add_repo("bob/m", src_folder)
        api = HfApi(endpoint=hub.endpoint, token="hf_other")
        api.model_info("bob/m")
        rec = hub.requests[-1]
        assert isinstance(rec, RequestRecord) and (rec.method, rec.path, rec.status) == ("GET", "/api/models/bob/m", 200)
        with pytest.raises(AttributeError):
            rec.status = 1
        hub.clear_log()
        assert hub.requests == []
        assert api.whoami()["name"] == "bob"
    with pytest.raises(RuntimeError):
        hub.endpoint
    with pytest.raises(httpx2.TransportError):  # stopped: kept-alive client connections are closed too
        api.model_info("bob/m")
    with LocalHub(tmp_path / "hub") as again:  # state lives on disk
        assert again.head("bob/m") == sha
        assert HfApi(endpoint=again.endpoint, token=False).model_info("bob/m").sha == sha
