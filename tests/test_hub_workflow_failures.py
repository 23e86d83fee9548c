"""Hub errors, failed and interrupted runs (then re-runs), remote names that try to escape the work
folder, and the token never showing up anywhere."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from huggingface_hub import HfApi, constants

from repair.hub.spec import HubSpec, check_remote_name, hub_spec
from repair.errors import BadInput, UsageError
from tests.hub_workflow_helpers import (  # noqa: F401 - fixtures
    SHARDS, SRC, assert_equals_local_fix, commits, hub, hub_env, run,
)


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_retry_sleep(monkeypatch):
    """huggingface_hub retries LFS PUTs with 1-8 s sleeps; skip the sleeps."""
    from huggingface_hub.utils import _http

    sleeps = []
    monkeypatch.setattr(_http, "time", SimpleNamespace(sleep=sleeps.append))
    return sleeps


# ----------------------------------------------------------------------------- what SRC names
def test_spec_parsing_local_path_wins(tmp_path, monkeypatch):
    assert hub_spec("alice/src") == HubSpec("alice/src") and hub_spec("alice/src@v1.0") == HubSpec("alice/src", "v1.0")
    assert hub_spec("alice/src@refs/pr/3") == HubSpec("alice/src", "refs/pr/3")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "alice" / "src").mkdir(parents=True)
    assert hub_spec("alice/src") is None  # an existing local folder always wins
    assert hub_spec("./x/y") is None and hub_spec("/abs/path") is None and hub_spec("just-a-name") is None
    with pytest.raises(UsageError, match="revision"):
        hub_spec("bob/model@")
    with pytest.raises(UsageError, match="not a Hub repo id"):
        hub_spec("a/b/c@main")


@pytest.mark.parametrize("name", ["../escape.txt", "/abs/evil.bin", "sub/../../up.txt", "dir\\evil.txt", "a//b.txt", ".cache/huggingface/x"])
def test_remote_names_are_checked(name):
    with pytest.raises(BadInput, match="refusing to use this repo"):
        check_remote_name(name, "alice/src@x")
    assert check_remote_name("sub/dir/tokenizer.json", "x") == "sub/dir/tokenizer.json"


# ----------------------------------------------------------------------------- missing things
def test_missing_repo_revision_and_file_are_one_line_errors(hub, broken, tmp_path, capsys):
    hub.add_repo(SRC, broken)
    cases = [
        (("inspect", "alice/nope"), "alice/nope: no such model repo on http://127.0.0.1:"),
        (("doctor", "alice/nope@main"), "alice/nope@main: no such model repo"),
        (("inspect", f"{SRC}@no-such-branch"), f"{SRC}@no-such-branch: no such revision"),
        (("hub", "fix", f"{SRC}@{'f' * 40}", "--to", "alice/x"), "no such revision"),
        (("fix", f"{SRC}@nope", "-o", tmp_path / "o"), "no such revision"),
        (("hub", "fix", SRC, "--to", "alice/x", "--original", "alice/no-original"), "alice/no-original: no such model repo"),
    ]
    for args, expected in cases:
        code, _, err = run(capsys, *args)
        assert code == 2 and expected in one_error_line(err), (args, err)

    partial = tmp_path / "partial"
    shutil.copytree(broken, partial)
    (partial / SHARDS[2]).unlink()
    sha = hub.add_repo("alice/partial", partial)
    code, _, err = run(capsys, "hub", "fix", "alice/partial", "--to", "alice/y")
    assert code == 2 and f"alice/partial@{sha}/{SHARDS[2]}: named in the index but missing" in one_error_line(err)

    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "config.json").write_text("{}")
    (pickled / "pytorch_model.bin").write_bytes(b"\x80\x04not really")
    hub.add_repo("alice/pickled", pickled)
    code, _, err = run(capsys, "inspect", "alice/pickled")
    assert code == 2 and "pytorch_model.bin: pickle checkpoints are refused" in one_error_line(err)
    assert not HfApi(endpoint=hub.endpoint).repo_exists("alice/x") and not HfApi(endpoint=hub.endpoint).repo_exists("alice/y")


def test_usage_errors_and_an_unrelated_destination(hub, broken, tmp_path, capsys):
    hub.add_repo(SRC, broken)
    assert "--to DST" in one_error_line(run(capsys, "hub", "fix", SRC)[2])
    assert "that is SRC itself" in one_error_line(run(capsys, "hub", "fix", SRC, "--to", SRC)[2])
    assert "use `ckpt-repair fix` here" in one_error_line(run(capsys, "hub", "fix", broken, "--to", "alice/z")[2])
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("someone else's repo")
    hub.add_repo("alice/other", other)
    head = hub.head("alice/other")
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/other")
    assert code == 2 and "exists and is not a fork of alice/src" in one_error_line(err) and hub.head("alice/other") == head


# ----------------------------------------------------------------------------- failed / interrupted runs
def test_upload_failing_midway_leaves_no_commit_and_a_rerun_finishes(hub, broken, local_fix, tmp_path, no_retry_sleep, capsys):
    sha = hub.add_repo(SRC, broken)
    hub.fail_uploads_after(100, times=6)  # the first LFS PUT and all 5 of the client's retries
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--workdir", tmp_path)
    line = one_error_line(err)
    assert code == 2 and "upload failed" in line and "nothing was committed, re-run the same command" in line
    assert len(no_retry_sleep) == 5
    assert hub.head("alice/fixed") == sha and commits(hub, "alice/fixed") == []  # an unmodified duplicate, no partial commit
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ckpt-repair-hub-")]  # work folder cleaned up

    hub.clear_log()
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--workdir", tmp_path)
    assert code == 0, err
    assert "exists (head" in err and not [r for r in hub.requests if r.path.endswith("/duplicate")]  # reused, not re-forked
    assert_equals_local_fix(hub.repo_files("alice/fixed"), local_fix, f"{SRC}@{sha}")
    assert len(HfApi(endpoint=hub.endpoint).list_repo_commits("alice/fixed")) == 2  # source + the one fix commit


def test_commit_failing_or_interrupted_then_rerun(hub, broken, local_fix, monkeypatch, capsys):
    sha = hub.add_repo(SRC, broken)
    assert run(capsys, "hub", "fix", SRC, "--to", "alice/first", "--quiet")[0] == 0  # LFS objects now stored
    hub.clear_log()
    hub.fail_uploads_after(10)  # no PUT is needed this time: the commit POST itself is cut off
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/second")
    assert code == 2 and "nothing was committed" in one_error_line(err)
    assert [r.status for r in commits(hub, "alice/second")] == [0] and hub.head("alice/second") == sha

    from repair.hub import publish

    real = publish.commit
    monkeypatch.setattr(publish, "commit", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/second", "--pr")
    assert code == 130 and ("interrupted" in err or "aborted" in err)  # click turns Ctrl-C into Abort
    assert hub.head("alice/second") == sha and hub.discussions(SRC) == []
    monkeypatch.setattr(publish, "commit", real)

    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/second", "--pr")
    assert code == 0, err
    assert_equals_local_fix(hub.repo_files("alice/second"), local_fix, f"{SRC}@{sha}")
    assert len(hub.discussions(SRC)) == 1


# ----------------------------------------------------------------------------- names escaping the work folder
@pytest.mark.parametrize("name", ["../escape.txt", "/abs/evil.bin", "sub/../../up.txt"])
def test_repo_whose_file_names_escape_the_folder_is_refused(hub, broken, tmp_path, capsys, name):
    hub.add_repo(SRC, broken)
    hub.add_raw_file(SRC, name, b"evil", lfs=name.endswith(".bin"))
    hub.clear_log()
    for args in (("inspect", SRC), ("doctor", SRC), ("hub", "fix", SRC, "--to", "alice/fixed", "--workdir", tmp_path),
                 ("fix", SRC, "-o", tmp_path / "out")):
        code, _, err = run(capsys, *args)
        line = one_error_line(err)
        assert code == 2 and repr(name) in line and "refusing to use this repo" in line, (args, err)
    assert not [r for r in hub.requests if "/resolve/" in r.path], "a file was fetched from a repo with escaping names"
    assert not HfApi(endpoint=hub.endpoint).repo_exists("alice/fixed") and not (tmp_path / "out").exists()
    assert not list(tmp_path.rglob("escape.txt")) and not list(tmp_path.rglob("up.txt"))


# ----------------------------------------------------------------------------- the token
def test_token_never_printed_logged_or_published(hub, broken, tmp_path, monkeypatch, caplog, capsys):
    caplog.set_level(logging.INFO)
    sha = hub.add_repo(SRC, broken)
    seen = []
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/t", "--pr", "--json")
    assert code == 0, err
    seen += [out, err]
    seen += [run(capsys, "doctor", SRC, "--json")[1], run(capsys, "inspect", SRC)[1]]

    wrong = "hf_WrongTokenValue0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", wrong)
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/u")  # reads work anonymously; the fork is refused
    assert code == 2 and "not authorized" in one_error_line(err)
    seen += [out, err]
    HfApi(endpoint=hub.endpoint, token=hub.token).create_repo("alice/private", private=True)
    code, out, err = run(capsys, "inspect", "alice/private")
    assert code == 2
    seen += [out, err]

    monkeypatch.delenv("HF_TOKEN")  # the saved login (huggingface_hub's token file) is used too
    Path(constants.HF_TOKEN_PATH).write_text(hub.token)
    code, out, err = run(capsys, "hub", "fix", SRC, "--to", "alice/saved", "--pr", "--json")
    assert code == 0 and json.loads(out)["pr"]["existing"] is True, err
    seen += [out, err, caplog.text]

    api = HfApi(endpoint=hub.endpoint, token=hub.token)
    for repo in ("alice/t", "alice/saved"):
        seen += [b.decode("utf-8", "replace") for b in hub.repo_files(repo).values()]
        seen += [f"{c.title}\n{c.message}" for c in api.list_repo_commits(repo)]
    seen += [json.dumps(d) for d in hub.discussions(SRC)]
    seen += [b.decode("utf-8", "replace") for b in hub.repo_files(SRC, "refs/pr/1").values()]
    for text in seen:
        assert hub.token not in text and wrong not in text
    assert hub.head("alice/saved") != sha
