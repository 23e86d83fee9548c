"""Hub sources and `hub fix` against tools.hub_server.LocalHub with the real huggingface_hub client.

HF_ENDPOINT points at the local server (127.0.0.1, dynamic port), HF_HUB_DISABLE_XET=1 and telemetry
off (also set in the root conftest). The request log is the evidence of what was downloaded and
uploaded. Failure, re-run, name-escaping and token cases are in test_hub_workflow_failures.py.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi, constants
from huggingface_hub.utils import disable_progress_bars

from repair.cli import main
from repair.examples import GEMMA4_31B, TINY, assistant_config, write_assistant
from repair.arch import gemma4_assistant
from repair.io.safetensors import read_header
from tools.hub_server import LocalHub

SRC = "alice/src"
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]  # 1: untouched, 2: pre_projection, 3: post_projection
CARD = "---\nlicense: apache-2.0\ntags:\n- gemma\nbase_model: google/gemma-4-assistant\nbase_model_relation: quantized\n---\n# Broken assistant\n\nSource card text that must be kept.\n"


# ----------------------------------------------------------------------------- fixtures and helpers
@pytest.fixture(autouse=True)
def hub_env(monkeypatch, tmp_path):
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)  # in case huggingface_hub was imported before the env vars
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "saved-token"))  # no real saved login leaks in
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with disable_progress_bars():
        yield


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with LocalHub(tmp_path / "hub") as h:
        monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
        monkeypatch.setenv("HF_TOKEN", h.token)
        yield h


@pytest.fixture(scope="module")
def broken(tmp_path_factory) -> Path:
    """The tiny broken assistant in three shards (only shards 2 and 3 change), with a model card."""
    folder = write_assistant(tmp_path_factory.mktemp("hubsrc") / "broken", TINY, shards=[["pre_projection"], ["post_projection"]])
    (folder / "README.md").write_text(CARD)
    (folder / "tokenizer_config.json").write_text('{"model_max_length": 4096}\n')
    return folder


@pytest.fixture(scope="module")
def local_fix(broken, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("localfix") / "fixed"
    main(["fix", str(broken), "-o", str(out), "--quiet"])
    return out


def run(capsys, *args) -> tuple[int, str, str]:
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def full_gets(hub, repo=SRC) -> list[str]:
    """Files of `repo` downloaded whole (GET without Range)."""
    prefix = f"/{repo}/resolve/"
    return [r.path.rsplit("/", 1)[1] for r in hub.requests if r.method == "GET" and r.path.startswith(prefix) and r.range is None]


def ranged(hub, name: str) -> list[tuple[int, int]]:
    """[start, end) of every ranged GET of one file."""
    out = []
    for r in hub.requests:
        if r.method == "GET" and r.path.endswith("/" + name) and r.range:
            start, end = r.range.removeprefix("bytes=").split("-")
            out.append((int(start), int(end) + 1))
    return out


def uploads(hub) -> list[str]:
    return [r.path for r in hub.requests if r.method == "PUT" and r.path.startswith("/__lfs/")]


def commits(hub, repo) -> list:
    return [r for r in hub.requests if r.method == "POST" and r.path.startswith(f"/api/models/{repo}/commit/")]


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def assert_equals_local_fix(remote: dict[str, bytes], local: Path, label: str, *, card_replaced: bool = True) -> None:
    """Byte-equal to a local `fix` except README.md (the fork's card) and the report's source fields:
    `source.path` (the local folder vs `owner/name@sha`) and README.md's output sha256 (the card)."""
    mine = folder_files(local)
    assert set(remote) - {".gitattributes"} == set(mine)
    differ = {n for n in mine if mine[n] != remote[n]}
    assert differ == ({"README.md", "repair_report.json"} if card_replaced else {"repair_report.json"})
    ours, theirs = json.loads(mine["repair_report.json"]), json.loads(remote["repair_report.json"])
    assert theirs["source"]["path"] == label
    their_outputs = {o["name"]: o["sha256"] for o in theirs["outputs"]}
    if card_replaced:
        assert their_outputs["README.md"] == sha256(remote["README.md"])
    ours["source"]["path"] = label
    ours["outputs"] = theirs["outputs"]
    assert ours == theirs


def shard_header_ends(folder: Path) -> dict[str, int]:
    return {n: read_header(folder / n).data_start for n in SHARDS}


# ----------------------------------------------------------------------------- inspect / doctor
def test_inspect_and_doctor_on_a_hub_repo_read_headers_not_shards(hub, broken, capsys):
    sha = hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, _ = run(capsys, "inspect", f"{SRC}@main")
    assert code == 0
    local = run(capsys, "inspect", broken)[1]
    assert out.splitlines()[0] == f"{SRC}@{sha}: " + local.splitlines()[0].split(": ", 1)[1]
    assert out.splitlines()[1:] == local.splitlines()[1:]
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")], "inspect downloaded a shard"
    ends = shard_header_ends(broken)
    for name in SHARDS:  # exactly the 8-byte length prefix and the header, nothing else
        assert sorted(ranged(hub, name)) == [(0, 8), (8, ends[name])]
    assert set(full_gets(hub)) == {"config.json", "hf_quant_config.json", "model.safetensors.index.json"}
    assert all(r.method in ("GET", "HEAD") for r in hub.requests)
    assert json.loads(run(capsys, "inspect", SRC, "--json")[1])["source"] == f"{SRC}@{sha}"

    hub.clear_log()
    code, out, _ = run(capsys, "doctor", SRC, "--target", "vllm==0.24.0")
    assert (code, out) == run(capsys, "doctor", broken, "--target", "vllm==0.24.0")[:2] and code == 1
    assert not [n for n in full_gets(hub) if n.endswith(".safetensors")], "doctor downloaded a shard"
    read = sum(e - s for n in SHARDS for s, e in ranged(hub, n))
    total = sum((broken / n).stat().st_size for n in SHARDS)
    assert read < total * 0.2, f"doctor read {read} of {total} shard bytes (headers and scales only)"


# ----------------------------------------------------------------------------- fork-and-fix
def test_fork_and_fix_downloads_only_changed_shards_and_equals_a_local_fix(hub, broken, local_fix, capsys):
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


# ----------------------------------------------------------------------------- other recipes / fix with a Hub SRC
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


def test_fix_to_a_local_folder_from_a_hub_repo(hub, broken, local_fix, tmp_path, capsys):
    hub.add_repo(SRC, broken)
    hub.clear_log()
    code, out, _ = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--dry-run")
    assert code == 0 and "dry run" in out and not [n for n in full_gets(hub) if n.endswith(".safetensors")]
    code, out, err = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err
    got, want = folder_files(tmp_path / "out"), folder_files(local_fix)
    assert set(got) == set(want) and {n for n in got if got[n] != want[n]} == {"repair_report.json"}
    report = json.loads(got["repair_report.json"])
    assert Path(report["source"]["path"]).is_relative_to(tmp_path / "hf-home" / "hub")  # huggingface_hub's cache


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


# ----------------------------------------------------------------------------- the 31B-shape acceptance run
def _weights_31b(config: dict) -> dict[str, torch.Tensor]:
    """Real 31B-assistant shapes, cheaply: a random block tiled over each matrix, norms near 1."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for spec in gemma4_assistant.expected_modules(config).values():
        name = spec.name if spec.role in ("scalar", "buffer") else f"{spec.name}.weight"
        if len(spec.shape) == 2:
            rows, cols = spec.shape
            block = 0.05 * torch.randn((64, cols), generator=gen)
            out[name] = block.to(torch.bfloat16).repeat((rows + 63) // 64, 1)[:rows].contiguous()
        else:
            out[name] = (1 + 0.1 * torch.randn(spec.shape, generator=gen)).to(torch.bfloat16)
    return out


def test_31b_shape_fork_and_fix_downloads_only_the_changed_shard(hub, tmp_path, capsys):
    """The broken 31B-shape assistant (vocab 262144: a 512 MB embedding, in its own shard that is never downloaded)."""
    src = write_assistant(tmp_path / "big", GEMMA4_31B, shards=[["model.layers"], ["pre_projection", "post_projection"]],
                          weights=_weights_31b(assistant_config(GEMMA4_31B)))
    assert (src / SHARDS[0]).stat().st_size > 512 << 20
    (src / "README.md").write_text(CARD)
    sha = hub.add_repo(SRC, src)
    local = tmp_path / "local"
    assert run(capsys, "fix", src, "-o", local, "--quiet")[0] == 0
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed-31b", "--workdir", tmp_path, "--json")
    assert code == 0, err
    result = json.loads(out)

    assert [n for n in full_gets(hub) if n.endswith(".safetensors")] == [SHARDS[2]]  # only the changed shard
    assert set(full_gets(hub)) == {SHARDS[2], "config.json", "hf_quant_config.json", "model.safetensors.index.json",
                                   "generation_config.json", "README.md"}
    header_end = read_header(src / SHARDS[0]).data_start
    assert sorted(ranged(hub, SHARDS[0])) == [(0, 8), (8, header_end)]  # the 512 MB shard: its header, nothing else
    layers = read_header(src / SHARDS[1])  # unchanged too: its header and NVFP4 scales (planning and doctor read them)
    scales = sum(t.nbytes for t in layers.tensors if t.name.endswith((".weight_scale", ".weight_scale_2")))
    reads = ranged(hub, SHARDS[1])
    assert layers.data_start + scales <= sum(e - s for s, e in reads) <= layers.data_start + scales + (4 << 10) * len(reads)
    assert scales < layers.size / 8
    assert len(uploads(hub)) == 1 and len(commits(hub, "alice/fixed-31b")) == 1
    changed = (local / SHARDS[2]).stat().st_size
    assert result["peak_work_bytes"] < 2 * changed + (8 << 20), "disk use is not bounded by the changed shard"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("ckpt-repair-hub-")] == []

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    tree = {e.path: e for e in api.list_repo_tree("alice/fixed-31b", recursive=True)}
    mine = {p.name: p for p in local.iterdir()}
    assert set(tree) == set(mine)
    for name, path in mine.items():  # LFS files by the Hub's sha256; small files byte for byte
        if tree[name].lfs is not None:
            assert tree[name].lfs.sha256 == hashlib.sha256(path.read_bytes()).hexdigest(), name
    small = {n: b for n, b in hub.repo_files("alice/fixed-31b").items() if tree[n].lfs is None}
    assert_equals_local_fix(small | {n: (local / n).read_bytes() for n in mine if tree[n].lfs is not None},
                            local, f"{SRC}@{sha}", card_replaced=True)
    info = api.model_info("alice/fixed-31b")
    assert info.card_data.base_model == SRC and {"ckpt-repair", "nvfp4"} <= set(info.tags)
    readme = small["README.md"].decode()
    assert sha in readme and "### What was wrong" in readme and "### After" in readme and result["fix_id"] in readme


def test_card_keeps_the_text_replaces_its_own_section_and_survives_bad_yaml():
    from repair.hub.card import BEGIN, END, fork_card

    first = fork_card(CARD, source_repo=SRC, title="alice/f", text=f"{BEGIN}\nfirst repair\n{END}", quantized=True)
    again = fork_card(first, source_repo="alice/f", title="alice/g", text=f"{BEGIN}\nsecond repair\n{END}", quantized=False)
    assert again.count(BEGIN) == 1 and "second repair" in again and "first repair" not in again
    assert "Source card text that must be kept." in again and "base_model: alice/f" in again
    assert "- gemma" in again and "- ckpt-repair" in again and "license: apache-2.0" in again
    broken_yaml = fork_card("---\n: : not yaml\n---\nprose stays\n", source_repo=SRC, title="t", text=f"{BEGIN}\nx\n{END}", quantized=True)
    assert broken_yaml.startswith("---\nbase_model: alice/src\n") and "prose stays" in broken_yaml


def test_original_given_as_a_hub_repo(hub, broken_export, original_model, tmp_path, capsys):
    """--original alice/orig (a Hub id): it is downloaded whole (huggingface_hub's cache) and verified like `fix` does."""
    sha = hub.add_repo(SRC, broken_export)
    hub.add_repo("alice/orig", original_model)
    local = tmp_path / "local"
    assert run(capsys, "fix", broken_export, "-o", local, "--original", original_model, "--quiet")[0] == 0
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fo", "--original", "alice/orig", "--json")
    assert code == 0, err
    got, want = hub.repo_files("alice/fo"), folder_files(local)
    assert {n for n in want if want[n] != got.get(n)} <= {"README.md", "repair_report.json"}
    theirs, ours = json.loads(got["repair_report.json"]), json.loads(want["repair_report.json"])
    assert theirs["original"]["verified"] == ours["original"]["verified"] == ours["original"]["checked"] > 0
    assert Path(theirs["original"]["path"]).is_relative_to(tmp_path / "hf-home" / "hub")  # the cached download
    assert [c["action"] for c in theirs["changes"]] == [c["action"] for c in ours["changes"]]
    for report in (theirs, ours):  # the source / original path fields are the only differences
        report["source"]["path"] = report["original"]["path"] = None
        report["outputs"] = [o for o in report["outputs"] if o["name"] != "README.md"]
    assert theirs == ours and theirs["source"]["files"] and "alice/orig@" in got["README.md"].decode()
    assert sha in got["README.md"].decode()
