"""`hub fix SRC --to DST`, the fork, against tools.hub_server.LocalHub with the real huggingface_hub
client: a server-side duplicate plus ONE commit that downloads and uploads only the changed shards and
equals a local `fix`, a re-run that does nothing, a dry run that writes nothing, `--target bf16`, the
fallback to uploading everything when the server cannot duplicate, and the fork's model card. The
request log is the evidence; the 31B-shape run is in test_hub_fix_31b.py."""

from __future__ import annotations

import json

from huggingface_hub import HfApi

from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    CARD, SHARDS, SRC, assert_equals_local_fix, commits, full_gets, hub, hub_env, ranged, run, uploads,
)


# ----------------------------------------------------------------------------- fork-and-fix
def test_fork_and_fix_downloads_only_changed_shards_and_equals_a_local_fix(hub, broken, local_fix, capsys, monkeypatch):
    import repair.hub.source as source

    monkeypatch.setattr(source, "FIRST_READ", 16)  # these shards are smaller than a first read: make it a prefix
    sha = hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["status"] == "done" and result["source"]["sha"] == sha and result["fork"]["created"] == "duplicated"

    shard_downloads = [n for n in full_gets(hub) if n.endswith(".safetensors")]
    assert sorted(shard_downloads) == SHARDS[1:] == sorted(result["downloaded"])
    untouched = sum(e - s for s, e in ranged(hub, SHARDS[0]))
    assert untouched < (broken / SHARDS[0]).stat().st_size / 2, "the unchanged shard was read beyond its header and scales"
    assert [r.path for r in hub.requests if r.path.endswith("/duplicate")] == [f"/api/models/{SRC}/duplicate"]
    assert len(uploads(hub)) == 2  # the two rewritten shards; configs, index, report and card go inline in the commit
    assert len(commits(hub, "alice/fixed")) == 1 and not commits(hub, SRC)

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    history = api.list_repo_commits("alice/fixed")
    assert [c.commit_id for c in history[:2]] == [hub.head("alice/fixed"), sha]  # ONE commit on top of the duplicate
    assert history[0].title == result["title"] and result["fix_id"] in result["title"]
    assert_equals_local_fix(hub.repo_files("alice/fixed"), local_fix, f"{SRC}@{sha}")

    card = hub.repo_files("alice/fixed")["README.md"].decode()
    info = api.model_info("alice/fixed")
    assert info.card_data.base_model == SRC and "base_model_relation" not in info.card_data.to_dict()
    assert {"gemma", "ckpt-repair", "nvfp4"} <= set(info.tags)
    assert "# Broken assistant" in card and "Source card text that must be kept." in card
    for fact in ("### What was wrong", "### What was changed", "### After", sha, '"action": "dequantize"',
                 "pre_projection: dequantize nvfp4", "0 error(s), 0 warning(s)", "handshake-quantized",
                 "google/gemma-4-assistant", result["fix_id"]):
        assert fact in card, fact
    assert not list(hub.root.glob("tmp/lfs-*"))


def test_rerun_on_a_fixed_fork_does_nothing(hub, broken, capsys):
    hub.add_repo(SRC, broken)
    assert run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--quiet")[0] == 0
    head = hub.head("alice/fixed")
    hub.clear_log()
    code, out, _ = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--json")
    assert code == 0 and json.loads(out)["status"] == "up-to-date" and json.loads(out)["fork"]["already_fixed"]
    assert hub.head("alice/fixed") == head and not uploads(hub) and not commits(hub, "alice/fixed")
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")]


def test_dry_run_reads_headers_and_changes_nothing(hub, broken, capsys):
    sha = hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--pr", "--dry-run")
    assert code == 0 and "dry run" in out
    assert "will be a server-side duplicate" in err and f"based on {sha}" in err and SHARDS[1] in err
    assert all(r.method in ("GET", "HEAD") for r in hub.requests), "a dry run wrote to the hub"
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")]
    assert not HfApi(endpoint=hub.endpoint).repo_exists("alice/fixed") and hub.discussions(SRC) == []


# ----------------------------------------------------------------------------- other recipes
def test_target_bf16_removes_hf_quant_config_in_the_same_commit(hub, broken, tmp_path, capsys):
    sha = hub.add_repo(SRC, broken)
    local = tmp_path / "local-bf16"
    assert run(capsys, "fix", broken, "-o", local, "--target", "bf16", "--quiet")[0] == 0
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/bf16", "--target", "bf16", "--quiet")
    assert code == 0, err
    files = hub.repo_files("alice/bf16")
    assert "hf_quant_config.json" not in files and len(commits(hub, "alice/bf16")) == 1
    assert_equals_local_fix(files, local, f"{SRC}@{sha}")
    info = HfApi(endpoint=hub.endpoint).model_info("alice/bf16")
    assert "ckpt-repair" in info.tags and "nvfp4" not in info.tags


# ----------------------------------------------------------------------------- no server-side duplicate
def test_server_without_duplicate_falls_back_to_uploading_everything(hub, broken, local_fix, monkeypatch, capsys):
    import httpx2
    from huggingface_hub.errors import HfHubHTTPError

    def refuse(self, *args, **kwargs):
        response = httpx2.Response(405, request=httpx2.Request("POST", f"{hub.endpoint}/api/models/{SRC}/duplicate"))
        raise HfHubHTTPError("405 Method Not Allowed", response=response)

    monkeypatch.setattr(HfApi, "duplicate_repo", refuse)
    sha = hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/copy", "--json")
    assert code == 0, err
    result = json.loads(out)
    assert result["fork"]["created"] == "created" and "cannot duplicate" in err
    assert SHARDS[0] in result["fork"]["uploaded_unchanged"] and len(commits(hub, "alice/copy")) == 1
    # every shard is downloaded and offered to the new repo's LFS storage (LocalHub's store is shared, so it
    # answers "already stored" for the unchanged one instead of taking a PUT; the real Hub would take the upload)
    assert sorted(n for n in full_gets(hub) if n.endswith(".safetensors")) == SHARDS
    assert len([r for r in hub.requests if r.path == "/alice/copy.git/info/lfs/objects/batch"]) == 3
    assert_equals_local_fix(hub.repo_files("alice/copy"), local_fix, f"{SRC}@{sha}")


# ----------------------------------------------------------------------------- the fork's card
def test_card_keeps_the_text_replaces_its_own_section_and_survives_bad_yaml():
    from repair.hub.card import BEGIN, END, fork_card

    first = fork_card(CARD, source_repo=SRC, title="alice/f", text=f"{BEGIN}\nfirst repair\n{END}", quantized=True)
    again = fork_card(first, source_repo="alice/f", title="alice/g", text=f"{BEGIN}\nsecond repair\n{END}", quantized=False)
    assert again.count(BEGIN) == 1 and "second repair" in again and "first repair" not in again
    assert "Source card text that must be kept." in again and "base_model: alice/f" in again
    assert "- gemma" in again and "- ckpt-repair" in again and "license: apache-2.0" in again
    broken_yaml = fork_card("---\n: : not yaml\n---\nprose stays\n", source_repo=SRC, title="t", text=f"{BEGIN}\nx\n{END}", quantized=True)
    assert broken_yaml.startswith("---\nbase_model: alice/src\n") and "prose stays" in broken_yaml
