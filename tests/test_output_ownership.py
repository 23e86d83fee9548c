"""Publishing never removes what we did not write: OUT appearing mid-run, concurrent runs, --original
as a protected input, a symlinked OUT, modes under the umask, and OUT names near the length limit."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import repair.execute.writer as execute
from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured, run_cli
from tests.test_reliability_corpus import tree


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("own") / "src", TINY)


@pytest.fixture(scope="module")
def earlier(src, tmp_path_factory) -> Path:
    """An earlier ckpt-repair output of SRC, to copy where a test needs one."""
    out = tmp_path_factory.mktemp("earlier") / "out"
    assert run_cli("fix", src, "-o", out, "--quiet") == 0
    return out


def users_folder(path: Path) -> dict[str, str]:
    path.mkdir()
    (path / "notes.txt").write_text("my notes\n")
    return tree(path)


def one_line(err: str) -> bool:
    return len(err.strip().splitlines()) == 1 and "Traceback" not in err


def build_then(monkeypatch, action) -> None:
    """Run `action()` after the output is built, just before it is published."""
    real = execute._build

    def build(*args, **kwargs):
        report = real(*args, **kwargs)
        action()
        return report

    monkeypatch.setattr(execute, "_build", build)


def test_out_created_by_someone_else_during_the_run_is_left_alone(capsys, monkeypatch, src, tmp_path):
    out = tmp_path / "out"
    mine = {}
    build_then(monkeypatch, lambda: mine.update(tree=users_folder(out)))
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet")
    assert code == 2 and one_line(err) and "appeared while this run was writing" in err, err
    assert tree(out) == mine["tree"], "the user's folder was replaced"
    assert [p.name for p in tmp_path.iterdir()] == ["out"], "the temp folder or lock was left behind"


def test_overwrite_never_swaps_away_a_folder_that_replaced_our_output_meanwhile(capsys, monkeypatch, src, earlier, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    mine = {}

    def replace_with_users_folder():
        shutil.rmtree(out)
        mine["tree"] = users_folder(out)

    build_then(monkeypatch, replace_with_users_folder)
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet", "--overwrite")
    assert code == 2 and one_line(err) and "not a ckpt-repair output" in err, err
    assert tree(out) == mine["tree"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


CHILD = r"""
import sys, time
from pathlib import Path
import repair.execute.writer as ex
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
real = ex._build
def build(*a, **k):
    ready.write_text("building")
    while not go.exists():
        time.sleep(0.01)
    return real(*a, **k)
ex._build = build
from repair.cli import main
main(sys.argv[3:])
"""


def test_two_concurrent_runs_into_one_out_one_wins_the_other_fails_with_one_line(capsys, src, earlier, tmp_path):
    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    ready, go = tmp_path / "ready", tmp_path / "go"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    first = subprocess.Popen([sys.executable, "-c", CHILD, str(ready), str(go), "fix", str(src), "-o", str(out), "--quiet", "--overwrite"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ready.exists(), first.communicate()[1]
        code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet", "--overwrite")
    finally:
        go.write_text("go")
        _, first_err = first.communicate(timeout=120)
    assert first.returncode == 0, first_err
    assert code == 2 and one_line(err) and "another ckpt-repair run is writing this folder" in err, err
    assert tree(out) == tree(earlier)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["go", "out", "ready"], "a lock or temp folder was left behind"


@pytest.fixture(scope="module")
def orig_case(broken_export, original_model) -> tuple[Path, Path]:
    return broken_export, original_model


def test_out_inside_the_original_is_refused(capsys, orig_case, tmp_path):
    src, original = orig_case
    orig = tmp_path / "orig"
    shutil.copytree(original, orig)
    before = tree(orig)
    code, _, err = run_captured(capsys, "fix", src, "-o", orig / "fixed", "--original", orig, "--quiet")
    assert code == 2 and one_line(err) and "inside the --original folder" in err, err
    assert tree(orig) == before


def test_out_equal_to_an_original_that_is_an_earlier_output_is_refused(capsys, orig_case, tmp_path):
    src, original = orig_case
    orig = tmp_path / "orig"
    shutil.copytree(original, orig)
    (orig / "repair_report.json").write_text("{}\n")  # it looks like an earlier ckpt-repair output
    before = tree(orig)
    code, _, err = run_captured(capsys, "fix", src, "-o", orig, "--original", orig, "--overwrite", "--quiet")
    assert code == 2 and one_line(err) and "--original" in err, err
    assert tree(orig) == before


def test_overwrite_onto_a_symlinked_out_is_refused_and_touches_nothing(capsys, src, earlier, tmp_path):
    real = tmp_path / "real"
    shutil.copytree(earlier, real)
    before = tree(real)
    link = tmp_path / "out"
    link.symlink_to(real)
    code, _, err = run_captured(capsys, "fix", src, "-o", link, "--overwrite", "--quiet")
    assert code == 2 and one_line(err) and "is a symlink" in err, err
    assert tree(real) == before, "something was written into the link's target"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "real"] and link.is_symlink()


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_published_modes_are_what_cp_r_gives_under_the_umask(src, tmp_path, umask):
    old = os.umask(umask)
    try:
        assert run_cli("fix", src, "-o", tmp_path / "out", "--quiet") == 0
        copy = tmp_path / "copy"
        subprocess.run(["cp", "-r", str(src), str(copy)], check=True)
    finally:
        os.umask(old)
    out = tmp_path / "out"
    assert stat.S_IMODE(out.stat().st_mode) == stat.S_IMODE(copy.stat().st_mode) == 0o777 & ~umask
    assert stat.S_IMODE((src / "model.safetensors").stat().st_mode) == 0o600  # safetensors writes 0600: cp -r keeps that
    for path in out.rglob("*"):
        twin = copy / path.relative_to(out)
        want = stat.S_IMODE(twin.stat().st_mode) if twin.exists() else 0o666 & ~umask  # the report has no source
        assert stat.S_IMODE(path.stat().st_mode) == want, path


def test_out_name_near_the_file_name_limit_is_written(capsys, src, tmp_path):
    out = tmp_path / ("o" * 250)
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet")
    assert code == 0, err
    assert (out / "repair_report.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


@pytest.mark.parametrize("spelling", [".", "..", "sub/..", "/"])
def test_out_spelled_as_the_current_or_parent_folder_is_refused_by_name(capsys, src, earlier, tmp_path, monkeypatch, spelling):
    """`-o .` or `-o ..` inside an earlier output: the temp folder and lock would go inside OUT itself and the
    rename would fail with an OS error blaming the disk; say instead that OUT must name a folder."""
    work = tmp_path / "earlier"
    shutil.copytree(earlier, work)
    (work / "sub" / "sub").mkdir(parents=True)
    monkeypatch.chdir(work / "sub")
    before = tree(work)
    code, _, err = run_captured(capsys, "fix", src, "-o", spelling, "--overwrite", "--quiet")
    assert code == 2 and one_line(err) and "name the folder to write" in err, err
    assert tree(work) == before


def test_overwrite_without_an_atomic_exchange_checks_what_it_moved_away(capsys, monkeypatch, src, earlier, tmp_path):
    """Where renameat2 cannot exchange (another OS, a file system without RENAME_EXCHANGE), OUT is renamed aside,
    then the new one in. A folder that replaced OUT between the last check and that rename was deleted as ours."""
    import repair.io.output as output

    out = tmp_path / "out"
    shutil.copytree(earlier, out)
    real_rename2, real_proven, mine = output._rename2, output.still_proven, {}
    monkeypatch.setattr(output, "_rename2", lambda a, b, flags: False if flags == output._RENAME_EXCHANGE else real_rename2(a, b, flags))

    def proven_then_replaced(folder, proof):
        ok = real_proven(folder, proof)
        if folder == out and "tree" not in mine:
            shutil.rmtree(out)
            mine["tree"] = users_folder(out)
        return ok

    monkeypatch.setattr(output, "still_proven", proven_then_replaced)
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet", "--overwrite")
    assert code == 2 and one_line(err) and "not a ckpt-repair output" in err, err
    assert tree(out) == mine["tree"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
