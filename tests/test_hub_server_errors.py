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


# -------------------------------------------------------------------------- rights
def test_rights_follow_token_role_and_namespace(hub, api, src_folder):
    """As on the Hub: a write token changes repos in its user's namespace and its organizations (a writer
    role), and proposes (pull requests) anywhere it can read; a read token does neither. auth_check and
    whoami say so before any write is tried."""
    hub.orgs.update({"acme": "write", "club": "read"})
    hub.add_repo(REPO, src_folder)
    hub.add_repo("bob/theirs", src_folder)
    hub.add_token("hf_readonly_token", role="read")
    reader = HfApi(endpoint=hub.endpoint, token="hf_readonly_token")
    me = api.whoami()
    assert me["auth"]["accessToken"]["role"] == "write" and reader.whoami()["auth"]["accessToken"]["role"] == "read"
    assert {o["name"]: o["roleInOrg"] for o in me["orgs"]} == {"acme": "write", "club": "read"}

    def status(call) -> int:
        try:
            call()
        except HfHubHTTPError as err:
            return err.response.status_code
        return 200

    add = lambda: [CommitOperationAdd("x.txt", b"x")]  # noqa: E731
    assert status(lambda: api.auth_check(REPO, write=True)) == 200 and status(lambda: reader.auth_check(REPO)) == 200
    assert status(lambda: reader.auth_check(REPO, write=True)) == 403
    assert status(lambda: api.auth_check("bob/theirs", write=True)) == 403
    with pytest.raises(RepositoryNotFoundError):
        api.auth_check("alice/nope", write=True)
    assert status(lambda: reader.create_repo("alice/r")) == 403
    assert status(lambda: reader.create_commit(REPO, operations=add(), commit_message="c")) == 403
    assert status(lambda: reader.create_commit(REPO, operations=add(), commit_message="c", create_pr=True)) == 403
    assert status(lambda: api.create_repo("bob/mine")) == 403 and status(lambda: api.create_repo("club/x")) == 403
    assert status(lambda: api.duplicate_repo(REPO, "bob/copy")) == 403
    assert status(lambda: api.create_commit("bob/theirs", operations=add(), commit_message="c")) == 403
    assert not api.repo_exists("bob/mine") and not api.repo_exists("bob/copy") and not api.repo_exists("alice/r")
    assert api.create_repo("acme/x").repo_id == "acme/x" and api.duplicate_repo(REPO, "acme/copy").repo_id == "acme/copy"
    pr = api.create_commit("bob/theirs", operations=add(), commit_message="proposal", create_pr=True)
    assert pr.pr_url and hub.repo_files("bob/theirs", "refs/pr/1")["x.txt"] == b"x"


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
