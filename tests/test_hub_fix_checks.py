"""`hub fix` checks everything before it reads a shard, against tools.hub_server.LocalHub with the real
huggingface_hub client: a repo whose module is split over two shards is fixed like a local `fix`; runs
that must fail (a token that may not write, a bad revision, an unplannable checkpoint) fail with one
line, and the request log shows no shard downloaded and nothing written; a killed run's work folder is
removed by the next run. The token's rights as whoami-v2 states them are read by `access.grants_of`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import HfApi
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from repair.cli import main
from repair.demo.examples import write_assistant
from repair.hub.access import grants_of
from repair.hub.source import FIRST_READ, SCALE_LEAVES
from repair.io.safetensors import read_header
from repair.io.staging import MARKER
from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    CARD, SRC, assert_equals_local_fix, commits, full_gets, hub, hub_env, run,
)
from tests.test_interruption import dead_pid
from tests.test_hub_workflow_failures import one_error_line

SPLIT = {  # module-name prefixes per extra shard (write_assistant): where post_projection's tensors sit
    "input_scale_apart": [["post_projection.weight"]],  # its input_scale in shard 1, weight and scales in shard 2
    "input_scale_alone": [["post_projection.input_scale"], ["post_projection"]],  # shard 2 holds only the input_scale
}


def assistant(folder: Path, shards) -> Path:
    write_assistant(folder, shards=shards)
    (folder / "README.md").write_text(CARD)
    return folder


def shard_tensors(files: dict[str, bytes], tmp: Path) -> dict[str, list[str]]:
    """tensor name -> the shards that store it (read back with the safetensors library)."""
    where: dict[str, list[str]] = {}
    for name, data in files.items():
        if name.endswith(".safetensors"):
            (tmp / name).write_bytes(data)
            with safe_open(tmp / name, "np") as fh:
                for key in fh.keys():
                    where.setdefault(key, []).append(name)
    return where


# ----------------------------------------------------------------------------- a module split over shards
@pytest.mark.parametrize("layout", sorted(SPLIT))
def test_split_module_repo_is_fixed_like_a_local_fix(hub, tmp_path, capsys, layout):
    src = assistant(tmp_path / "src", SPLIT[layout])
    local = tmp_path / "local-fix"
    main(["fix", str(src), "-o", str(local), "--quiet"])
    capsys.readouterr()
    sha = hub.add_repo(SRC, src)
    hub.clear_log()
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--json")
    assert code == 0, err
    files = hub.repo_files("alice/fixed")
    assert_equals_local_fix(files, local, f"{SRC}@{sha}")
    where = shard_tensors(files, tmp_path)
    assert all(len(shards) == 1 for shards in where.values()), {t: s for t, s in where.items() if len(s) > 1}
    index = json.loads(files["model.safetensors.index.json"])
    assert index["weight_map"] == {t: s[0] for t, s in where.items()}
    stored = [n for n in files if n.endswith(".safetensors")]
    assert index["metadata"]["total_size"] == sum(os.path.getsize(tmp_path / n) - read_header(tmp_path / n).data_start for n in stored)
    result = json.loads(out)
    assert sorted(n for n in full_gets(hub) if n.endswith(".safetensors")) == sorted(result["downloaded"])
    if layout == "input_scale_alone":  # the shard that held only a dropped tensor is gone from the fork
        assert "model-00002-of-00003.safetensors" not in files and "model-00002-of-00003.safetensors" in hub.repo_files(SRC)


def test_compressed_tensors_repo_is_planned_from_its_real_global_scales(hub, ct_export, tmp_path, capsys):
    """compressed-tensors stores its global scale as `weight_global_scale`: planning and doctor must read
    those bytes from the Hub too (left out, they read as 0.0 and a sound export was refused as broken)."""
    src = tmp_path / "src"
    shutil.copytree(ct_export, src)
    (src / "README.md").write_text(CARD)
    local = tmp_path / "local-fix"
    main(["fix", str(src), "-o", str(local), "--quiet"])
    capsys.readouterr()
    sha = hub.add_repo(SRC, src)
    code, out, err = run(capsys, "doctor", SRC, "--json")
    assert "global-scale" not in out, out
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed")
    assert code == 0, err
    assert_equals_local_fix(hub.repo_files("alice/fixed"), local, f"{SRC}@{sha}")


# ----------------------------------------------------------------------------- refusals before any shard byte
def planning_pieces(folder: Path) -> dict[str, tuple[set[int], set[int]]]:
    """Per shard: where a read for planning may start and end (its length prefix, its header, and its
    NVFP4 scale tensors (repair.hub.source.SCALE_LEAVES); nearby scale ranges are fetched together, so a read spans one or more of them)."""
    out = {}
    for path in folder.glob("*.safetensors"):
        header = read_header(path)
        scales = [t for t in header.tensors if t.name.endswith(SCALE_LEAVES)]  # doctor reads input scales too
        first = min(path.stat().st_size, FIRST_READ)  # a shard's first read: its header and what follows, up to this
        out[path.name] = ({0, 8} | {t.start for t in scales}, {8, header.data_start, first} | {t.end for t in scales})
    return out


def shard_reads(hub) -> list[tuple[str, str | None]]:
    """(shard, Range) of every request that read a shard's bytes."""
    return [(r.path.rsplit("/", 1)[1], r.range) for r in hub.requests
            if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(".safetensors")]


def aligned(rng: str | None, pieces: tuple[set[int], set[int]]) -> bool:
    if rng is None:  # a whole shard
        return False
    start, end = (int(x) for x in rng.removeprefix("bytes=").split("-"))
    return start in pieces[0] and end + 1 in pieces[1]


def assert_wrote_nothing(hub, *repos: str) -> None:
    assert all(r.method in ("GET", "HEAD") for r in hub.requests), [r for r in hub.requests if r.method not in ("GET", "HEAD")]
    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    assert not [r for r in repos if api.repo_exists(r)] and hub.discussions(SRC) == []


@pytest.fixture
def split_repo(hub, tmp_path):
    hub.orgs.update({"acme": "write"})
    src = assistant(tmp_path / "src", SPLIT["input_scale_apart"])
    hub.add_repo(SRC, src)
    HfApi(endpoint=hub.endpoint, token=hub.token).duplicate_repo(SRC, "acme/fork")  # a fork that exists
    hub.add_token("hf_readonly_token", role="read")
    hub.clear_log()
    return src


@pytest.mark.parametrize("args, token, expected", [
    (("--to", "alice/fixed"), "hf_readonly_token", "--to alice/fixed: the token is read-only; choose another --to"),
    (("--to", "bob/fixed"), None, "--to bob/fixed: alice may not create repos under 'bob' (only under alice, acme)"),
    (("--to", "acme/fork"), "demoted", "--to acme/fork: the token may not write to this repo"),
    (("--pr",), "hf_readonly_token", f"--pr on {SRC}: the token is read-only, so it may not open a pull request"),
    (("--to", "alice/fixed", "--pr"), "hf_readonly_token", "--to alice/fixed: the token is read-only"),
    (("--to", "alice/fixed"), "hf_WrongTokenValue0123456789", "--to alice/fixed: not authorized"),
    (("--to", "alice/fixed"), "", "--to alice/fixed: no token found: set HF_TOKEN or run `hf auth login`"),
])
def test_a_token_that_may_not_write_is_refused_before_any_shard_is_read(hub, split_repo, monkeypatch, capsys, args, token, expected):
    if token == "demoted":  # alice is still a member of acme, but may no longer write there
        hub.orgs["acme"] = "read"
    elif token == "":
        monkeypatch.delenv("HF_TOKEN")
    elif token:
        monkeypatch.setenv("HF_TOKEN", token)
    head = hub.head("acme/fork")
    for dry in ((), ("--dry-run",)):  # a dry run runs the same checks
        hub.clear_log()
        code, _, err = run(capsys, "hub", "fix", SRC, *args, *dry)
        assert code == 2 and expected in one_error_line(err), err
        assert shard_reads(hub) == []  # not even a header: the token is checked first
        assert_wrote_nothing(hub, "alice/fixed", "bob/fixed")
    assert hub.head("acme/fork") == head


def test_a_bad_revision_is_refused_before_anything_else(hub, split_repo, capsys):
    for rev in ("no-such-branch", "f" * 40):
        code, _, err = run(capsys, "hub", "fix", f"{SRC}@{rev}", "--to", "alice/fixed", "--pr")
        assert code == 2 and "no such revision" in one_error_line(err), err
    assert [r.path for r in hub.requests] == [f"/api/models/{SRC}/revision/{rev}" for rev in ("no-such-branch", "f" * 40)]
    assert_wrote_nothing(hub, "alice/fixed")


def test_an_unplannable_checkpoint_is_refused_from_headers_and_scales(hub, tmp_path, capsys):
    src = assistant(tmp_path / "nan", SPLIT["input_scale_apart"])
    shard = src / "model-00002-of-00002.safetensors"
    tensors = load_file(shard)
    tensors["post_projection.weight_scale_2"] = torch.tensor(float("nan"))
    save_file(tensors, shard, metadata={"format": "pt"})
    hub.add_repo(SRC, src)
    hub.clear_log()
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--pr")
    line = one_error_line(err)
    assert code == 2 and f"{shard.name}: post_projection.weight_scale_2: global scale is NaN" in line, err
    pieces = planning_pieces(src)
    reads = shard_reads(hub)
    assert reads and all(aligned(rng, pieces[name]) for name, rng in reads), reads
    assert_wrote_nothing(hub, "alice/fixed")


# ----------------------------------------------------------------------------- a killed run's work folder
def marked(folder: Path, pid: int) -> Path:
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"pid": pid, "host": socket.gethostname()}))
    return folder


def signalled_at_first_download(hub, broken, work: Path, sig: int) -> tuple[subprocess.Popen, str]:
    """`hub fix` in a child process, sent `sig` once it says it downloads its first shard (before any fork exists),
    while every request it still needs waits on the server's lock; the child and the rest of its stderr."""
    hub.add_repo(SRC, broken)
    work.mkdir()
    child = subprocess.Popen([sys.executable, "-m", "repair", "hub", "fix", SRC, "--to", "alice/fixed", "--workdir", str(work)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        for line in child.stderr:
            if line.startswith("download "):
                break
        with hub.store.lock:
            child.send_signal(sig)
            rest = child.stderr.read()
        child.wait(timeout=60)
    finally:
        child.kill()
        child.stderr.close()
    return child, rest


def test_a_terminated_run_removes_its_work_folder_and_forks_nothing(hub, broken, tmp_path):
    """SIGTERM (a service manager, `timeout`, the web page's shutdown) acts as Ctrl-C does: the work folder, which
    holds downloaded shards, is removed on the way out, one line says so, exit 130; no fork was made."""
    child, rest = signalled_at_first_download(hub, broken, tmp_path / "work", signal.SIGTERM)
    assert child.returncode == 130 and "interrupted; nothing was written" in rest and "Traceback" not in rest, rest
    assert [p.name for p in (tmp_path / "work").iterdir()] == []
    assert "alice/fixed" not in [m.id for m in HfApi(endpoint=hub.endpoint).list_models(author="alice")]


def test_a_killed_run_leaves_a_work_folder_the_next_run_removes(hub, broken, tmp_path, capsys):
    work = tmp_path / "work"
    child, _ = signalled_at_first_download(hub, broken, work, signal.SIGKILL)
    left = [p for p in work.iterdir() if p.name.startswith("ckpt-repair-hub-")]
    assert [p.name.split("-")[3] for p in left] == [str(child.pid)] and (left[0] / MARKER).is_file()
    assert "alice/fixed" not in [m.id for m in HfApi(endpoint=hub.endpoint).list_models(author="alice")]  # forked only after the checks

    alive = marked(work / f"ckpt-repair-hub-{os.getpid()}-live", os.getpid())  # a run still going: not ours to remove
    unmarked = work / f"ckpt-repair-hub-{dead_pid()}-nomark"  # holds something and no marker: not provably ours
    unmarked.mkdir()
    (unmarked / "notes.txt").write_text("not ours")
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--workdir", work)
    assert code == 0 and "fork: alice/fixed (" in err, err
    assert sorted(p.name for p in work.iterdir()) == sorted([alive.name, unmarked.name])
    assert "alice/fixed" in [m.id for m in HfApi(endpoint=hub.endpoint).list_models(author="alice")]


def test_a_work_folder_that_cannot_be_made_is_one_line(hub, broken, capsys):
    """--workdir exists but no folder can be made in it (procfs refuses mkdir, even to root): one line,
    exit 2, nothing asked of the Hub beyond the checks, instead of a FileNotFoundError traceback."""
    hub.add_repo(SRC, broken)
    hub.clear_log()
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--workdir", "/proc/self")
    line = one_error_line(err)
    assert code == 2 and line.startswith("error: /proc/self: cannot create a work folder here") and "--workdir" in line, err
    assert_wrote_nothing(hub, "alice/fixed")


def test_inspect_of_a_hub_repo_removes_stale_work_folders_in_the_temp_folder(hub, broken, tmp_path, monkeypatch, capsys):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    hub.add_repo(SRC, broken)
    pid = dead_pid()
    stale = marked(tmp_path / f"ckpt-repair-hub-{pid}-stale", pid)
    assert run(capsys, "inspect", SRC)[0] == 0
    assert not stale.exists()


# ----------------------------------------------------------------------------- whoami-v2, read
def whoami(role: str, *, orgs=(), scoped=(), everywhere=()) -> dict:
    """A whoami-v2 answer in the Hub's form: fine-grained permissions per entity and global ones."""
    token = {"displayName": "t", "role": role, "createdAt": "2026-01-01T00:00:00.000Z"}
    if role == "fineGrained":
        token["fineGrained"] = {"canReadGatedRepos": False, "global": list(everywhere),
                                "scoped": [{"entity": {"_id": "x", "type": kind, "name": name}, "permissions": perms}
                                           for kind, name, perms in scoped]}
    return {"type": "user", "name": "alice", "orgs": [{"type": "org", "name": n, "roleInOrg": r} for n, r in orgs],
            "auth": {"type": "access_token", "accessToken": token}}


def test_whoami_grants_classic_and_fine_grained_tokens():
    write = grants_of(whoami("write", orgs=[("acme", "contributor"), ("club", "read")]))
    assert write.may_create_in("alice") is None and write.may_create_in("acme") is None
    assert "only under alice, acme" in write.may_create_in("club") and write.may_propose_on("bob/m") is None
    read = grants_of(whoami("read"))
    assert read.may_create_in("alice") == read.may_propose_on("bob/m") == "the token is read-only"
    fine = grants_of(whoami("fineGrained", orgs=[("acme", "admin")], scoped=[
        ("user", "alice", ["repo.content.read", "repo.write"]), ("org", "acme", ["repo.content.read", "discussion.write"]),
        ("model", "bob/m", ["discussion.write"])]))
    assert fine.may_create_in("alice") is None and fine.may_create_in("Alice") is None
    assert "lacks 'repo.write' for 'acme'" in fine.may_create_in("acme")
    assert fine.may_propose_on("acme/x") is None and fine.may_propose_on("bob/m") is None and fine.may_propose_on("alice/y") is None
    assert "lacks 'discussion.write' for bob/other" in fine.may_propose_on("bob/other")
    assert grants_of(whoami("fineGrained", everywhere=["discussion.write"])).may_propose_on("bob/other") is None
    for hostile in (None, [], {"auth": "x", "orgs": {"a": 1}}, {"name": 3, "auth": {"accessToken": {"role": ["write"]}}}):
        grants = grants_of(hostile)
        assert grants.may_propose_on("bob/m") and grants.may_create_in("alice")  # malformed: grants nothing


# ----------------------------------------------------------------------------- the output's doctor check
@pytest.mark.parametrize("args", [("--to", "alice/fixed"), ("--pr",)], ids=["fork", "pr"])
def test_hub_fix_target_refuses_an_output_doctor_rejects_before_any_commit(hub, tmp_path, monkeypatch, capsys, args):
    """`fix --target` refuses an output doctor --strict rejects for the target; `hub fix --target` committed it.
    With planning's refusal switched off, the kept FP8 layer's infinite scale reaches the output check: exit 2,
    no commit on the fork or the PR branch, no pull request."""
    import repair.planning.build as build
    from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed

    monkeypatch.setattr(build, "refuse_unrepairable", lambda *a: None)
    tensors = tensors_for(healthy_layers())
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = torch.tensor(float("inf"))
    hub.add_repo(SRC, write_mixed(tmp_path / "src", tensors=tensors))
    hub.clear_log()
    code, _, err = run(capsys, "hub", "fix", SRC, *args, "--target", "vllm==0.32.0", "--quiet")
    line = one_error_line(err)
    assert code == 2 and "[fp8-scale] model.layers.0.self_attn.q_proj.weight_scale is infinite" in line, err
    assert "doctor --strict" in line and "nothing was committed" in line
    assert "was created" not in line, line
    assert hub.store.get("alice/fixed") is None, "the fork was created before the output's check (issue 25, 10a)"
    assert not commits(hub, SRC) and hub.discussions(SRC) == []
    assert not [r for r in hub.requests if r.method not in ("GET", "HEAD") and "/alice/fixed" in r.path], "something was sent to the fork"
