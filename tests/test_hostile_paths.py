"""Names and files that come from data are hostile: `unshard` never writes or reads outside its
folders, FIFOs never hang a command, a Hub-cache snapshot cannot smuggle an outside file in, and
index names are checked. Every escape test hashes a "victim" folder beside OUT before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured, run_cli
from tests.test_reliability_corpus import tree

MANIFEST = "tp_manifest.json"


@pytest.fixture(scope="module")
def tp_output(tmp_path_factory) -> Path:
    """A real `fix --tp 2` output of a three-shard source (so its manifest has an index)."""
    root = tmp_path_factory.mktemp("tpsrc")
    src = write_assistant(root / "src", TINY, shards=[["pre_projection"], ["post_projection"]])
    assert run_cli("fix", src, "-o", root / "tp", "--tp", "2", "--quiet") == 0
    return root / "tp"


@pytest.fixture
def scene(tmp_path, tp_output) -> dict:
    """A copy of the tp output to tamper with, and a victim folder beside the OUT to be written."""
    src = tmp_path / "tp"
    shutil.copytree(tp_output, src)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "x").write_text("the victim's file\n")
    (victim / "secret.txt").write_text("not for OUT\n")
    return {"src": src, "out": tmp_path / "out", "victim": victim, "root": tmp_path}


def manifest(src: Path) -> dict:
    return json.loads((src / MANIFEST).read_text())


def save(src: Path, m: dict) -> None:
    (src / MANIFEST).write_text(json.dumps(m))


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_refused_and_nothing_written(capsys, scene: dict, *words: str) -> str:
    victim_before, src_before = tree(scene["victim"]), tree(scene["src"])
    siblings = sorted(p.name for p in scene["root"].iterdir())
    code, _, err = run_captured(capsys, "unshard", scene["src"], "-o", scene["out"])
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err
    assert tree(scene["victim"]) == victim_before, "a file outside OUT changed"
    assert tree(scene["src"]) == src_before, "the input changed"
    assert not scene["out"].exists()
    assert sorted(p.name for p in scene["root"].iterdir()) == siblings, "something was left beside OUT"
    return err


def test_index_name_leaving_out_is_refused(capsys, scene):
    m = manifest(scene["src"])
    assert m["standard"]["index"] is not None
    m["standard"]["index"]["name"] = "../victim/x"
    save(scene["src"], m)
    assert_refused_and_nothing_written(capsys, scene, "standard.index.name", "'..'")


def test_absolute_path_in_standard_files_is_refused(capsys, scene):
    m = manifest(scene["src"])
    target = str(scene["victim"] / "x")
    m["standard"]["files"].append(target)
    m["ranks"][0]["files"][target] = sha(scene["victim"] / "x")
    save(scene["src"], m)
    assert_refused_and_nothing_written(capsys, scene, "absolute path")


def test_shard_name_leaving_out_is_refused(capsys, scene):
    m = manifest(scene["src"])
    m["standard"]["shards"][0]["name"] = "../victim/planted.safetensors"
    save(scene["src"], m)
    assert_refused_and_nothing_written(capsys, scene, "standard.shards[0].name")


def test_symlink_in_a_rank_folder_pointing_out_is_refused(capsys, scene):
    link = scene["src"] / "rank-0" / "notes.txt"
    link.symlink_to(scene["victim"] / "secret.txt")
    m = manifest(scene["src"])
    m["standard"]["files"].append("notes.txt")
    m["ranks"][0]["files"]["notes.txt"] = sha(scene["victim"] / "secret.txt")
    save(scene["src"], m)
    assert_refused_and_nothing_written(capsys, scene, "leads outside")


@pytest.mark.parametrize("edit, words", [
    (lambda m: m.pop("ranks"), ["ranks is not a list"]),
    (lambda m: m["ranks"][1].update(folder="../victim"), ["ranks[1].folder"]),
    (lambda m: m["ranks"][0]["files"].update({"../../victim/x": "0" * 64}), ["ranks[0].files"]),
    (lambda m: m.update(tp=3), ["ranks is not a list of 3 entries"]),
    (lambda m: m["standard"].update(files="config.json"), ["standard.files is not a list"]),
    (lambda m: next(iter(m["tensors"].values())).update(dim=7), [".dim 7"]),
    (lambda m: next(iter(m["tensors"].values())).update(shape=[2**64, 0]), [".shape"]),
    (lambda m: m["standard"]["shards"][0]["tensors"].append("no.such.tensor"), ["no.such.tensor"]),
    (lambda m: m["standard"]["shards"][1].update(name=m["standard"]["shards"][0]["name"]), ["appears twice"]),
    (lambda m: m["standard"]["shards"][0].update(header="{not json"), ["standard.shards[0].header"]),
    (lambda m: m["standard"]["index"].update(name=".ckpt-repair-partial"), ["hidden"]),
    (lambda m: m["standard"]["shards"][0].update(metadata={"format": "\ud800"}), ["metadata", "not valid Unicode"]),
    (lambda m: m.update(source="\udcff"), ["source is not valid Unicode"]),
], ids=["no-ranks", "rank-folder-escape", "rank-file-escape", "tp-mismatch", "files-not-list", "bad-dim", "huge-shape",
        "unknown-tensor", "duplicate-shard", "bad-header", "hidden-name", "surrogate-metadata", "surrogate-source"])
def test_malformed_manifest_values_are_one_line(capsys, scene, edit, words):
    m = manifest(scene["src"])
    edit(m)
    save(scene["src"], m)
    assert_refused_and_nothing_written(capsys, scene, "tp_manifest.json", *words)


# ----------------------------------------------------------------------------- FIFOs: stat, never open
def run_in_child(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a subprocess with a timeout, so a hang fails the test instead of stalling it."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "repair", *args], capture_output=True, text=True, timeout=60, cwd=cwd, env=env)


def assert_one_line(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    for word in words:
        assert word in done.stderr, done.stderr


def test_fifo_anywhere_in_src_does_not_hang_fix(tmp_path):
    src = write_assistant(tmp_path / "src", TINY)
    (src / "extras").mkdir()
    os.mkfifo(src / "extras" / "notes.txt")
    done = run_in_child("fix", str(src), "-o", str(tmp_path / "out"), "--quiet")
    assert_one_line(done, "notes.txt", "FIFO")
    assert not (tmp_path / "out").exists()


def test_fifo_as_the_shard_does_not_hang_inspect(tmp_path):
    src = write_assistant(tmp_path / "src", TINY)
    (src / "model.safetensors").unlink()
    os.mkfifo(src / "model.safetensors")
    assert_one_line(run_in_child("inspect", str(src)), "model.safetensors", "FIFO")


def test_fifo_as_a_rank_file_does_not_hang_unshard(tmp_path, tp_output):
    src = tmp_path / "tp"
    shutil.copytree(tp_output, src)
    (src / "rank-1" / "model.safetensors").unlink()
    os.mkfifo(src / "rank-1" / "model.safetensors")
    assert_one_line(run_in_child("unshard", str(src), "-o", str(tmp_path / "out")), "rank-1", "FIFO")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_recipe_that_is_a_fifo_or_a_device_does_not_hang_fix(tmp_path, kind):
    src = write_assistant(tmp_path / "src", TINY)
    recipe = tmp_path / "recipe.toml"
    if kind == "fifo":
        os.mkfifo(recipe)
    else:
        recipe = Path("/dev/zero")  # reads without end: read_text would fill the memory
    done = run_in_child("fix", str(src), "-o", str(tmp_path / "out"), "--recipe", str(recipe), "--quiet")
    assert_one_line(done, str(recipe), "not a regular file")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------- Hub-cache layout, index names, subfolders
def hub_cache_snapshot(root: Path, src: Path, blobs_elsewhere: bool) -> Path:
    """huggingface_hub's layout: snapshots/<sha>/<file> -> ../../blobs/<hash>; `blobs` may itself be a link."""
    repo = root / "models--alice--m"
    blobs = (root / "elsewhere") if blobs_elsewhere else repo / "blobs"
    blobs.mkdir(parents=True)
    if blobs_elsewhere:
        (root / "elsewhere" / "secret").write_text("outside the cache\n")
        (repo / "blobs").parent.mkdir(parents=True, exist_ok=True)
        (repo / "blobs").symlink_to(blobs)
    snap = repo / "snapshots" / ("a" * 40)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        digest = sha(f)
        shutil.copy(f, blobs / digest)
        (snap / f.name).symlink_to(Path("../../blobs") / digest)
    return snap


def test_hub_cache_snapshot_is_read_through_its_blobs(capsys, tmp_path):
    snap = hub_cache_snapshot(tmp_path / "cache", write_assistant(tmp_path / "src", TINY), blobs_elsewhere=False)
    code, _, err = run_captured(capsys, "fix", snap, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err


def test_hub_cache_whose_blobs_is_a_link_cannot_copy_an_outside_file_into_out(capsys, tmp_path):
    snap = hub_cache_snapshot(tmp_path / "cache", write_assistant(tmp_path / "src", TINY), blobs_elsewhere=True)
    (snap / "notes.txt").symlink_to(Path("../../blobs/secret"))
    code, _, err = run_captured(capsys, "fix", snap, "-o", tmp_path / "out", "--quiet")
    assert code == 2 and "symlink points outside the checkpoint folder" in err, err
    assert not (tmp_path / "out").exists()


def test_index_naming_a_shard_outside_the_folder_is_refused(capsys, tmp_path):
    src = write_assistant(tmp_path / "src", TINY, shards=[["pre_projection"]])
    index_path = next(src.glob("*.index.json"))
    index = json.loads(index_path.read_text())
    name = next(iter(index["weight_map"]))
    index["weight_map"][name] = "../victim/model.safetensors"
    index_path.write_text(json.dumps(index))
    code, _, err = run_captured(capsys, "inspect", src)
    assert code == 2 and "names must stay inside their folder" in err and len(err.strip().splitlines()) == 1, err


def test_safetensors_in_subfolders_are_copied_byte_for_byte_and_said(capsys, tmp_path):
    src = write_assistant(tmp_path / "src", TINY)
    (src / "extras").mkdir()
    shutil.copy(src / "model.safetensors", src / "extras" / "draft.safetensors")
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err
    assert sha(tmp_path / "out" / "extras" / "draft.safetensors") == sha(src / "extras" / "draft.safetensors")
    assert "not checked or repaired" in out and "extras/draft.safetensors" in out


# ----------------------------------------------------------------------------- a mistyped local path
def test_mistyped_local_path_is_not_blamed_on_the_network(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: a network error if the Hub is tried
    (tmp_path / "work").mkdir()
    code, _, err = run_captured(capsys, "inspect", "work/fixd")  # the parent exists: a local path
    assert code == 2 and "work/fixd: not a folder" in err, err
    code, _, err = run_captured(capsys, "fix", "no-such-dir/x", "-o", "out")  # could be a repo id: say both
    assert code == 2 and "no-such-dir/x: no such local folder" in err and len(err.strip().splitlines()) == 1, err


def test_unknown_user_in_a_tilde_path_is_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_captured(capsys, "inspect", "~no-such-user-ckpt/x")  # expanduser raises RuntimeError for it
    assert code == 2 and "~no-such-user-ckpt/x" in err and len(err.strip().splitlines()) == 1, err


def test_a_src_folder_whose_name_is_not_utf8_is_fixed_and_unsharded(capsys, tmp_path):
    """The reports and tp_manifest.json record SRC's path: a folder name with a byte that is not UTF-8
    (any Linux path may hold one) was a UnicodeEncodeError traceback when they were written."""
    src = write_assistant(Path(os.fsdecode(os.fsencode(tmp_path) + b"/s\xff")), TINY)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err
    assert "s\\xff" in json.loads((tmp_path / "out" / "repair_report.json").read_text(encoding="utf-8"))["source"]["path"]
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "tp", "--tp", "2", "--quiet")
    assert code == 0, err
    code, _, err = run_captured(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "back")
    assert code == 0, err


@pytest.mark.parametrize("where, spelling", [("snapshot", "."), ("snapshots", "a" * 40), ("snapshot", "../" + "a" * 40 + "/")])
def test_hub_cache_snapshot_given_by_a_relative_spelling_is_read_too(capsys, tmp_path, monkeypatch, where, spelling):
    """The same snapshot named `.` from inside it, or by its bare name from `snapshots/`, was refused
    ('symlink points outside the checkpoint folder'): the layout was read from the path as spelled."""
    snap = hub_cache_snapshot(tmp_path / "cache", write_assistant(tmp_path / "src", TINY), blobs_elsewhere=False)
    monkeypatch.chdir(snap if where == "snapshot" else snap.parent)
    code, _, err = run_captured(capsys, "fix", spelling, "-o", tmp_path / "out", "--quiet")
    assert code == 0, err


def test_a_manifest_grown_sparse_to_a_terabyte_is_refused_in_one_line(capsys, scene):
    """tp_manifest.json is read whole to be parsed: one grown to a terabyte (sparse: no disk used) is refused by its
    size in one line, never allocated (a MemoryError traceback) nor read through."""
    os.truncate(scene["src"] / MANIFEST, 1 << 40)
    code, _, err = run_captured(capsys, "unshard", scene["src"], "-o", scene["out"])
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(scene["src"] / MANIFEST) in err and "bytes" in err, err
    assert sorted(p.name for p in scene["root"].iterdir()) == ["tp", "victim"]
