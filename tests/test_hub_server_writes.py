"""Writes through the real huggingface_hub client against tools.hub_server.LocalHub (127.0.0.1 only, no
network): creating, duplicating and deleting repos, create_commit with regular, LFS and multipart LFS
files, deletes and skipped unchanged files, parent_commit checks, pull requests and their merge,
upload_folder with README YAML validation, and the discussions API."""

# First: importing the helpers sets the client's environment variables before huggingface_hub is imported.
from tests.hub_server_helpers import REPO, _client_env, api, hub, src_folder  # noqa: F401 - fixtures

import pytest
from huggingface_hub import CommitOperationAdd, CommitOperationDelete, HfApi
from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError


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
