"""`hub fix SRC --pr`, a pull request on the source repo, against tools.hub_server.LocalHub with the
real huggingface_hub client: the PR is opened once, based on the pinned commit, with main untouched
and the same files as a local `fix`; with `--to` as well, and SRC pinned to an older revision than
main, the fork is brought back to that commit server-side and fork and PR carry the same fix."""

from __future__ import annotations

import json

from huggingface_hub import HfApi

from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    CARD, SHARDS, SRC, assert_equals_local_fix, commits, full_gets, hub, hub_env, run, uploads,
)


# ----------------------------------------------------------------------------- pull requests
def test_pr_opens_once_based_on_the_pinned_commit(hub, broken, local_fix, capsys):
    sha = hub.add_repo(SRC, broken)
    code, out, err = run(capsys, "hub", "fix", f"{SRC}@main", "--pr", "--json")
    assert code == 0, err
    result = json.loads(out)
    [pr] = hub.discussions(SRC)
    assert (pr["title"], pr["status"], pr["base_commit"], pr["ref"]) == (result["title"], "open", sha, "refs/pr/1")
    assert result["pr"]["url"].endswith("/discussions/1") and hub.head(SRC) == sha  # main untouched
    assert "### What was wrong" in pr["description"] and sha in pr["description"]
    assert_equals_local_fix(hub.repo_files(SRC, "refs/pr/1"), local_fix, f"{SRC}@{sha}", card_replaced=False)

    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--pr")
    assert code == 0 and "already exists" in err and result["pr"]["url"] in err
    assert len(hub.discussions(SRC)) == 1
    assert not uploads(hub) and not commits(hub, SRC) and not [n for n in full_gets(hub) if n.endswith(".safetensors")]


def test_fork_and_pr_together_and_a_pinned_older_revision(hub, broken, tmp_path, capsys):
    """SRC@<old sha> while main has moved on: the fork (a duplicate of main) is brought back to the
    pinned commit server-side, the PR is based on it, and both carry the same fix."""
    old = hub.add_repo(SRC, broken)
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete

    api.create_commit(SRC, commit_message="later", operations=[
        CommitOperationAdd("extra.txt", b"added on main later"),
        CommitOperationAdd(SHARDS[0], (broken / SHARDS[2]).read_bytes()),  # an unchanged shard replaced upstream
        CommitOperationDelete("tokenizer_config.json")])
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", f"{SRC}@{old}", "--to", "alice/pinned", "--pr", "--json")
    assert code == 0, err
    result = json.loads(out)
    fork = hub.repo_files("alice/pinned")
    assert "extra.txt" not in fork and fork["tokenizer_config.json"] == (broken / "tokenizer_config.json").read_bytes()
    assert fork[SHARDS[0]] == (broken / SHARDS[0]).read_bytes() and result["fork"]["copied_server_side"] == 1
    assert len(uploads(hub)) == 2 and SHARDS[0] not in full_gets(hub)
    assert hub.discussions(SRC)[0]["base_commit"] == old
    pr_files = hub.repo_files(SRC, "refs/pr/1")
    same = lambda files: {n: v for n, v in files.items() if n not in ("README.md", "repair_report.json")}  # noqa: E731
    assert same(fork) == same(pr_files) and pr_files["README.md"] == CARD.encode()
    fork_report, pr_report = json.loads(fork["repair_report.json"]), json.loads(pr_files["repair_report.json"])
    assert fork_report["source"] == pr_report["source"] and fork_report["source"]["path"] == f"{SRC}@{old}"
    assert [o for o in fork_report["outputs"] if o["name"] != "README.md"] == [o for o in pr_report["outputs"] if o["name"] != "README.md"]


def test_an_interrupt_after_the_fork_commit_names_it(hub, broken, capsys, monkeypatch):
    """Ctrl-C between the fork's commit and the pull request said "nothing was written", with the fix already on the
    fork: the line names the fork's commit, and no pull request is opened."""
    from repair.hub import publish

    hub.add_repo(SRC, broken)
    real_commit = publish.commit

    def commit(repo, ops, **kwargs):
        if kwargs.get("pr"):
            raise KeyboardInterrupt
        return real_commit(repo, ops, **kwargs)

    monkeypatch.setattr(publish, "commit", commit)
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--pr", "--quiet")
    head = hub.head("alice/fixed")
    assert (code, err.strip().splitlines()[-1]) == (130, f"interrupted; alice/fixed@{head} was already written and is complete"), err
    assert hub.discussions(SRC) == []
