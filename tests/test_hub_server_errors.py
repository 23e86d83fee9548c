"""Failures of tools.hub_server.LocalHub as the real huggingface_hub client sees them (127.0.0.1 only, no
network): missing repos, revisions and files mapped to the client's exceptions and X-Error-Code headers,
private repos and missing or wrong tokens refused, and injected upload faults (connection resets, 500s,
LFS PUT retries) that leave the branch unchanged."""

# First: importing the helpers sets the client's environment variables before huggingface_hub is imported.
from tests.hub_server_helpers import REPO, _client_env, _raw, api, hub, src_folder  # noqa: F401 - fixtures

from types import SimpleNamespace

import httpx2  # the installed client's HTTP library
import pytest
from huggingface_hub import CommitOperationAdd, HfApi, hf_hub_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)


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
