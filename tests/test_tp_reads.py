"""`fix --tp` and `unshard` read every input byte once and copy whole files off the writing thread.

- A tensor every rank copies by byte range (replicated, or split along its first dim) is read by the kernel's copies
  only: the report's sha256 of its input shard comes from those same reads (io/hashing.SourceDigest), never from
  reading the shard again.
- Small files (each rank's config, tokenizer, ...; unshard's from rank 0) are copied whole by execute/copies.py
  beside the tensor writing, not after it; and the report's sha256 of every file is of the bytes it holds.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path

import pytest

import repair.tp.unshard as unshard_module
import repair.tp.write as tp_write
from repair.demo.examples import TINY, write_assistant
from repair.io.safetensors import read_header
from tests.conftest import run_cli

SHARDS = [[f"model.layers.{i}.{part}."] for i in range(2) for part in ("self_attn", "mlp")] + [["model.norm."]]
TOKENIZER = 3 << 20  # a tokenizer.json of a few MiB, as real ones are (Gemma's: 33 MB)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    src = write_assistant(tmp_path_factory.mktemp("tp-reads") / "src", TINY, shards=SHARDS)
    (src / "tokenizer.json").write_bytes(os.urandom(TOKENIZER))
    (src / "sub").mkdir()
    (src / "sub" / "chat_template.jinja").write_text("{{ messages }}")
    return src


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _reads_while_writing(monkeypatch) -> list[tuple[str, int, int]]:
    """Every pread / preadv of this process from the moment `fix --tp` starts writing, as (path, offset, bytes read)
    (planning reads scale values of its own)."""
    found, writing = [], []
    for name in ("pread", "preadv"):
        real = getattr(os, name)

        def counted(fd, what, offset, *rest, real=real, name=name):
            got = real(fd, what, offset, *rest)
            if writing:
                found.append((os.readlink(f"/proc/self/fd/{fd}"), offset, len(got) if name == "pread" else got))
            return got
        monkeypatch.setattr(os, name, counted)
    real_build = tp_write.build_atomically
    monkeypatch.setattr(tp_write, "build_atomically", lambda *a, **k: writing.append(1) or real_build(*a, **k))
    return found


def test_fix_tp_hashes_each_input_shard_from_the_bytes_its_copies_read(src, tmp_path, monkeypatch):
    reads = _reads_while_writing(monkeypatch)
    out = tmp_path / "out"
    assert run_cli("fix", src, "-o", out, "--tp", "2", "--quiet") == 0
    monkeypatch.undo()
    report = json.loads((out / "repair_report.json").read_text())
    tensors = json.loads((out / "tp_manifest.json").read_text())["tensors"]
    assert {f["name"]: f["sha256"] for f in report["source"]["files"]} == {
        p.relative_to(src).as_posix(): _sha(p) for p in src.rglob("*") if p.is_file()}
    assert all(_sha(out / o["name"]) == o["sha256"] for o in report["outputs"])
    untouched = 0
    for shard in sorted(src.glob("*.safetensors")):
        for t in read_header(shard).tensors:
            entry = tensors.get(t.name)  # None: the plan drops it (a dequantized layer's scales)
            copied_by_range = entry is not None and [entry["dtype"], entry["shape"]] == [t.dtype, list(t.shape)] and entry["dim"] in (None, 0)
            if copied_by_range and t.nbytes:
                untouched += 1
                start, end = t.start, t.start + t.nbytes
                again = [(o, n) for path, o, n in reads if path == str(shard.resolve()) and o < end and o + n > start]
                assert not again, f"{shard.name}: {t.name} [{start}, {end}) was read into memory: {again[:3]}"
    assert untouched > 10


def _complete_while_writing(monkeypatch, module, attribute, files: dict[Path, int]) -> list[bool]:
    """Wraps `module.attribute` (called as the tensor writing starts): at its first call, waits up to 10 s for every
    file of `files` (path -> size) to be complete; records whether they were."""
    real, seen = getattr(module, attribute), []

    def waiting(*args, **kwargs):
        if not seen:
            deadline = time.monotonic() + 10
            while not all(_size(p) == n for p, n in files.items()) and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(all(_size(p) == n for p, n in files.items()) or {str(p): (_size(p), n) for p, n in files.items()})
        return real(*args, **kwargs)
    monkeypatch.setattr(module, attribute, waiting)
    return seen


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _partial(out: Path) -> Path:
    found = list(out.parent.glob(f".{out.name}.partial-*"))
    return found[0] if found else out.parent / "none"


def test_fix_tp_copies_small_files_beside_the_rank_files_not_after(src, tmp_path, monkeypatch):
    out = tmp_path / "out"
    small = {name: (src / name).stat().st_size for name in ("tokenizer.json", "sub/chat_template.jinja", "generation_config.json")}
    files = _LazyFiles(lambda: {_partial(out) / f"rank-{r}" / n: size for r in range(2) for n, size in small.items()})
    seen = _complete_while_writing(monkeypatch, tp_write._Slicer, "write", files)
    assert run_cli("fix", src, "-o", out, "--tp", "2", "--quiet") == 0
    assert seen == [True]
    for r in range(2):
        assert all(_sha(out / f"rank-{r}" / n) == _sha(src / n) for n in small)


def test_unshard_copies_small_files_beside_the_shards_not_after(src, tmp_path, monkeypatch):
    tp = tmp_path / "tp"
    assert run_cli("fix", src, "-o", tp, "--tp", "2", "--quiet") == 0
    out = tmp_path / "out"
    small = {name: (src / name).stat().st_size for name in ("tokenizer.json", "sub/chat_template.jinja", "generation_config.json")}
    files = _LazyFiles(lambda: {_partial(out) / n: size for n, size in small.items()})
    seen = _complete_while_writing(monkeypatch, unshard_module, "_concat", files)
    assert run_cli("unshard", tp, "-o", out) == 0
    assert seen == [True]
    report = json.loads((out / "repair_report.json").read_text())
    assert all(_sha(out / o["name"]) == o["sha256"] for o in report["outputs"])
    assert all(_sha(out / n) == _sha(src / n) for n in small)


class _LazyFiles(dict):
    """The temp folder's name is known only once the run has made it: the paths are computed when first looked at."""

    def __init__(self, make):
        super().__init__()
        self._make, self._lock = make, threading.Lock()

    def items(self):
        return self._make().items()


@pytest.mark.parametrize("command", ["fix --tp", "unshard"])
def test_an_error_while_small_files_are_copied_leaves_no_thread_open_file_or_temp_folder(command, src, tmp_path, monkeypatch, capsys):
    """A disk error on the main thread while small files are still being copied (each copier held inside its copy until
    0.5 s after the error): the run waits for those copies, closes every file and stops every thread before the temp
    folder goes, and says one line (exit 2), as fix does with its whole copies (tests/test_copies_ahead.py)."""
    import repair.execute.copies as copies
    from tests.conftest import run_captured
    from tests.test_copies_ahead import _open_files

    if command == "unshard":
        assert run_cli("fix", src, "-o", tmp_path / "tp", "--tp", "2", "--quiet") == 0
    release, failed, real_copy = threading.Event(), [], copies.copy_file_started

    def slow_copy(source, dst):
        out = real_copy(source, dst)
        release.wait(20)  # a copier still busy when the main thread fails
        return out

    def broken(*_a, **_k):
        time.sleep(0.2)  # the copies are started meanwhile
        failed.append(time.monotonic())
        threading.Timer(0.5, release.set).start()
        raise OSError(5, "Input/output error", "disk")

    monkeypatch.setattr(copies, "copy_file_started", slow_copy)
    monkeypatch.setattr(*((tp_write._Slicer, "write") if command == "fix --tp" else (unshard_module, "_write_shard")), broken)
    before = {t.ident for t in threading.enumerate()}
    args = ("fix", src, "--tp", "2", "--quiet") if command == "fix --tp" else ("unshard", tmp_path / "tp")
    code, _, err = run_captured(capsys, *args, "-o", tmp_path / "out")
    assert failed and code == 2 and len(err.strip().splitlines()) == 1 and "Input/output error" in err, err
    assert time.monotonic() - failed[0] >= 0.5, "the run left while a copy was still running"
    assert sorted(p.name for p in tmp_path.iterdir()) == (["tp"] if command == "unshard" else [])
    left = [t for t in threading.enumerate() if t.ident not in before and t.is_alive() and not isinstance(t, threading.Timer)]
    assert not left, left
    assert not [path for path in _open_files() if path.startswith(str(tmp_path / "out")) or ".out.partial-" in path]
