"""Reads through the real huggingface_hub client against tools.hub_server.LocalHub (127.0.0.1 only, no
network): repo info, file trees (paginated), commits and refs, hf_hub_download / snapshot_download of
small and LFS files at a branch or a pinned sha, HTTP Range requests, and safetensors metadata of
single-file and sharded repos read by ranged GETs."""

# First: importing the helpers sets the client's environment variables before huggingface_hub is imported.
from tests.hub_server_helpers import REPO, _client_env, _raw, api, hub, src_folder  # noqa: F401 - fixtures

import json
from pathlib import Path

import numpy as np
from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url, snapshot_download
from huggingface_hub.hf_api import RepoFile, RepoFolder
from safetensors.numpy import save_file


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
