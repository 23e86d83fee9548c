"""Every malformed input in tools/malformed/ fails cleanly through the real CLI.

Clean means: exit 2 (0 for the no-op), exactly one `error: file: tensor: defect; next step`
line on stderr and no traceback, nothing in OUT (no temp folders either), and the input's
bytes unchanged. The disk-full cases are here too, on a real tiny filesystem when we may
mount one and with a simulated ENOSPC always.
"""

from __future__ import annotations

import errno
import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from repair.cli import main
from tools.malformed import CASES, assistant, build

KNOWN_GAPS: dict[str, str] = {}


def run_cli(*args: str) -> int:
    try:
        main(list(args))
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def tree(path: Path) -> dict[str, str]:
    """sha256 of every file below `path` (links recorded as their target, never followed out)."""
    path = Path(path)
    if path.is_file():
        return {".": hashlib.sha256(path.read_bytes()).hexdigest()}
    out = {}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        if p.is_symlink():
            out[rel] = "link:" + os.readlink(p)
        elif p.is_file():
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def leftovers(out: Path) -> list[str]:
    parent = out.parent
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{out.name}.")) if parent.is_dir() else []


def assert_one_error_line(err: str, expect: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    line = lines[0]
    assert line.startswith("error: ") and "Traceback" not in err
    assert expect in line, f"{expect!r} not in {line!r}"
    assert "; " in line, f"no next step in {line!r}"
    return line


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN_GAPS[n], strict=True)) if n in KNOWN_GAPS else n for n in CASES])
def test_fix_refuses_malformed_input_cleanly(name, tmp_path, capsys):
    case = build(name, tmp_path)
    out = case.out or tmp_path / "out"
    src_before = tree(case.src)
    out_before = tree(out) if out.exists() else None
    code = run_cli("fix", str(case.src), "-o", str(out), "--quiet", *case.args)
    captured = capsys.readouterr()
    assert code == case.exit_code, captured.err
    if case.exit_code == 0:
        assert case.expect in captured.out and not captured.err
    else:
        assert_one_error_line(captured.err, case.expect)
        assert not captured.out
    assert (tree(out) if out.exists() else None) == out_before, "OUT was created or changed"
    assert not [n for n in leftovers(out) if ".partial-" in n], "a temp folder was left behind"
    assert tree(case.src) == src_before, "the input was modified"


@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("out_")])
def test_inspect_never_crashes_on_malformed_input(name, tmp_path, capsys):
    case = build(name, tmp_path)
    src_before = tree(case.src)
    code = run_cli("inspect", str(case.src))
    captured = capsys.readouterr()
    assert code in (0, 2), captured.err
    if code == 2:
        assert_one_error_line(captured.err, "")
    assert tree(case.src) == src_before


def test_no_input_in_the_corpus_makes_a_traceback(tmp_path):
    """The real CLI (`python -m repair`, its own process, as installed) on every case: `fix` ends with the
    case's exit code, at most one stderr line and never a traceback (`inspect` runs in-process above)."""
    import sys
    from concurrent.futures import ThreadPoolExecutor

    runs = []
    for name in CASES:
        case = build(name, tmp_path / name)
        out = case.out or tmp_path / name / "out"
        runs.append((name, "fix", (case.exit_code,), ["fix", str(case.src), "-o", str(out), "--quiet", *case.args]))

    def run(item):
        name, command, codes, args = item
        done = subprocess.run([sys.executable, "-m", "repair", *args], capture_output=True, text=True, timeout=120)
        return name, command, codes, done

    with ThreadPoolExecutor(2) as pool:
        for name, command, codes, done in pool.map(run, runs):
            assert "Traceback" not in done.stderr, f"{name} ({command}): {done.stderr}"
            assert done.returncode in codes and len(done.stderr.splitlines()) <= 1, f"{name} ({command}): {done.returncode} {done.stderr}"


def test_error_names_the_shard_for_a_sharded_checkpoint(tmp_path, capsys):
    """Module-level defects name the shard file the tensor is in, not just the folder."""
    import torch

    from tools.malformed import SHARD_2, edit_tensors

    src = assistant(tmp_path, sharded=True)
    edit_tensors(src / SHARD_2, lambda t: t.update({"pre_projection.weight_scale_2": torch.tensor(float("nan"))}))
    assert run_cli("fix", str(src), "-o", str(tmp_path / "out"), "--quiet") == 2
    line = assert_one_error_line(capsys.readouterr().err, "global scale is NaN")
    assert f"{src / SHARD_2}: pre_projection.weight_scale_2:" in line


def test_overwrite_refuses_a_folder_we_did_not_write(tmp_path, capsys):
    """--overwrite replaces an earlier output, never an arbitrary folder (say, $HOME)."""
    case = build("out_exists", tmp_path)
    before = tree(tmp_path / "out")
    assert run_cli("fix", str(case.src), "-o", str(tmp_path / "out"), "--quiet", "--overwrite") == 2
    assert_one_error_line(capsys.readouterr().err, "--overwrite only replaces an earlier ckpt-repair output")
    assert tree(tmp_path / "out") == before


def test_overwrite_replaces_an_earlier_output(tmp_path, capsys):
    src = assistant(tmp_path)
    first = tmp_path / "first"
    assert run_cli("fix", str(src), "-o", str(first), "--quiet") == 0
    assert run_cli("fix", str(src), "-o", str(first), "--quiet", "--overwrite") == 0
    assert (first / "repair_report.json").is_file() and leftovers(first) == []


# --- disk full ----------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (the tiny checkpoint's output needs ~110 KB); skipped where we may not mount."""
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def assert_disk_full_handled(src: Path, out: Path, capsys) -> None:
    before = tree(src)
    assert run_cli("fix", str(src), "-o", str(out), "--quiet") == 2
    line = assert_one_error_line(capsys.readouterr().err, "disk full while writing")
    assert "free space" in line and "re-run" in line
    assert not out.exists() and leftovers(out) == []
    assert tree(src) == before


def test_disk_full_on_a_real_small_filesystem(tmp_path, small_disk, capsys):
    src = assistant(tmp_path)
    assert_disk_full_handled(src, small_disk / "out", capsys)
    assert list(small_disk.iterdir()) == [], "the partial output was not removed"
    stat = os.statvfs(small_disk)
    assert stat.f_bfree == stat.f_blocks, "space was not given back"


def test_disk_full_simulated_mid_write(tmp_path, monkeypatch, capsys):
    """ENOSPC after 40 KB of output, wherever that falls (portable: needs no mount)."""
    src = assistant(tmp_path)
    real_write, written = os.write, [0]

    def write(fd, data):
        if written[0] > 40_000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written[0] += len(data)
        return real_write(fd, data)

    real_copy = os.copy_file_range

    def copy_file_range(src_fd, dst_fd, count, offset_src=None, offset_dst=None):  # kernel copies count too
        if written[0] > 40_000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        done = real_copy(src_fd, dst_fd, count, offset_src, offset_dst)
        written[0] += done
        return done

    monkeypatch.setattr(os, "write", write)
    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    assert_disk_full_handled(src, tmp_path / "fixed", capsys)
