"""Hub bytes are verified on every path (issue 25, point 3): a file taken whole from the Hub is checked
against its LFS sha256 (or its git blob id, for a small regular file) before it is used.

The local Hub serves an object whose bytes differ from its oid (same size, one byte flipped past the
header, so the header ranges still read). `fix owner/name -o OUT` used such a download unchecked and
wrote corrupted weights with exit 0, while `hub fix` refused the same repo.
"""

from __future__ import annotations

import shutil

import pytest

from tests.hub_workflow_helpers import SHARDS, SRC, hub, hub_env, run  # noqa: F401 - fixtures


def corrupt(hub, repo: str, name: str) -> None:
    """Change one byte of the object the server holds for `name`, keeping its size (its listing keeps the true
    oid): the last byte of a shard, the last digit of a JSON file (still valid JSON, another value)."""
    entry = hub.store.tree(hub.store.get(repo), hub.head(repo))[name]
    path = hub.store.object_path(entry["sha256"])
    data = bytearray(path.read_bytes())
    if name.endswith(".json"):
        at = max(i for i, b in enumerate(data) if chr(b).isdigit())
        data[at] = ord("7") if data[at] != ord("7") else ord("3")
    else:
        data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def one_line(err: str) -> str:
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err.strip()


@pytest.mark.parametrize("name", [SHARDS[0], SHARDS[1]], ids=["copied-shard", "rewritten-shard"])
def test_fix_of_a_hub_repo_to_a_local_out_refuses_a_download_that_does_not_match_its_sha256(hub, broken, capsys, tmp_path, name):
    hub.add_repo(SRC, broken)
    corrupt(hub, SRC, name)
    code, _, err = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet")
    line = one_line(err)
    assert code == 2 and name in line and "sha256" in line, line
    assert not (tmp_path / "out").exists()


def test_hub_fix_refuses_it_too(hub, broken, capsys):
    hub.add_repo(SRC, broken)
    corrupt(hub, SRC, SHARDS[1])
    code, _, err = run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--quiet")
    assert code == 2 and SHARDS[1] in one_line(err) and "sha256" in err, err
    assert hub.store.get("alice/fixed") is None


@pytest.mark.parametrize("command", ["inspect", "doctor"])
def test_inspect_and_doctor_refuse_a_config_that_does_not_match_its_git_blob_id(hub, broken, capsys, command):
    hub.add_repo(SRC, broken)
    corrupt(hub, SRC, "config.json")  # a small regular (non-LFS) file: checked against its git blob id
    code, _, err = run(capsys, command, SRC)
    line = one_line(err)
    assert code == 2 and "config.json" in line and "git blob id" in line, line


def test_an_original_given_as_a_hub_id_is_verified(hub, broken_export, original_model, capsys, tmp_path):
    hub.add_repo("alice/orig", original_model)
    shard = sorted(p.name for p in original_model.glob("*.safetensors"))[0]
    corrupt(hub, "alice/orig", shard)
    code, _, err = run(capsys, "fix", broken_export, "-o", tmp_path / "out", "--original", "alice/orig", "--quiet")
    line = one_line(err)
    assert code == 2 and shard in line and "sha256" in line, line
    assert not (tmp_path / "out").exists()


def test_a_clean_repo_still_fixes_and_a_corrupt_cached_copy_is_fetched_again(hub, broken, capsys, tmp_path):
    """After a refusal the damaged copy is not left in huggingface_hub's cache: once the server is right again,
    the same command succeeds."""
    hub.add_repo(SRC, broken)
    entry = hub.store.tree(hub.store.get(SRC), hub.head(SRC))[SHARDS[0]]
    good = hub.store.object_path(entry["sha256"]).read_bytes()
    corrupt(hub, SRC, SHARDS[0])
    assert run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet")[0] == 2
    hub.store.object_path(entry["sha256"]).write_bytes(good)
    code, _, err = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err
    shutil.rmtree(tmp_path / "out")


def dead_marked_copy(folder, into):
    """`folder` copied to `into`, holding a marker of a dead pid: named and marked like a killed run's work folder."""
    import json
    import socket

    from repair.io.staging import MARKER

    shutil.copytree(folder, into)
    (into / MARKER).write_text(json.dumps({"pid": 999999, "host": socket.gethostname()}))
    return into


def test_hub_fix_never_removes_a_local_original_named_like_a_dead_work_folder(hub, broken, original_model, capsys, tmp_path):
    """The work folder's cleanup (issue 25, 4: no cleanup removes an input) skips --original."""
    from tests.test_reliability_corpus import tree

    hub.add_repo(SRC, broken)
    work = tmp_path / "work"
    work.mkdir()
    orig = dead_marked_copy(original_model, work / "ckpt-repair-hub-999999-orig")
    before = tree(orig)
    run(capsys, "hub", "fix", SRC, "--to", "alice/fixed", "--workdir", work, "--original", orig, "--quiet")
    assert orig.is_dir() and tree(orig) == before, "--original was removed"


def test_fix_never_removes_a_local_src_named_like_a_dead_work_folder(hub, broken_export, original_model, capsys, tmp_path, monkeypatch):
    import tempfile

    from tests.test_reliability_corpus import tree

    hub.add_repo("alice/orig", original_model)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the Hub original's work folder goes
    src = dead_marked_copy(broken_export, tmp_path / "ckpt-repair-hub-999999-src")
    before = tree(src)
    run(capsys, "fix", src, "-o", tmp_path / "out", "--original", "alice/orig", "--quiet")
    assert src.is_dir() and tree(src) == before, "SRC was removed"


@pytest.mark.parametrize("name,field,value", [
    (SHARDS[1], "lfs.oid", 5), (SHARDS[1], "lfs.oid", ["x"]), (SHARDS[1], "lfs.oid", "ab" * 31), ("config.json", "oid", 7),
    ("config.json", "oid", "z" * 40), (SHARDS[1], "size", "abc"), (SHARDS[1], "size", None), (SHARDS[1], "size", 10**30),
    (SHARDS[1], "size", -5), (SHARDS[1], "size", True), (SHARDS[1], "size", 1 << 44)])
def test_a_listing_whose_hash_or_size_is_not_one_is_refused_in_one_line(hub, broken, capsys, tmp_path, monkeypatch, name, field, value):
    """What the listing says of a file is read from the network: an oid that is not hex of the right length, or a
    size that is not a count of bytes, ended in a traceback (`int.lower`, `int('abc')`, an OverflowError)."""
    import tools.hub_server.routes_read as routes

    hub.add_repo(SRC, broken)
    real = routes.file_json

    def lying(h, repo, sha, path, entry, expand):
        out = real(h, repo, sha, path, entry, expand)
        if path == name:
            *parents, key = field.split(".")
            (out[parents[0]] if parents else out)[key] = value
        return out

    monkeypatch.setattr(routes, "file_json", lying)
    code, _, err = run(capsys, "fix", SRC, "-o", tmp_path / "out", "--quiet")
    line = one_line(err)
    assert code == 2 and name in line, line
    assert not (tmp_path / "out").exists()
