"""`unshard` reads every rank file once: the bytes it rebuilds from are the bytes it hashes, and the rest of each
rank file (its header and header padding, a replicated tensor's copy on ranks past 0, another rank's config) is
hashed as the digest reaches it. A rank file whose sha256 differs from tp_manifest.json is refused at the end, before
anything appears: exit 2, one line naming the file, no OUT, no temp folder beside it, the input unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, HealthCheck
from hypothesis import strategies as st

from repair.demo.examples import TINY, write_assistant
from repair.io.safetensors import read_header
from tests.conftest import run_captured, run_cli
from tests.test_reliability_corpus import tree

SHARDS = [[f"model.layers.{i}.{part}."] for i in range(2) for part in ("self_attn", "mlp")] + [["model.norm."]]
SOME = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                database=None)


@pytest.fixture(scope="module")
def tp_out(tmp_path_factory) -> Path:
    """A real `fix --tp 2` output: replicated, dim-0 and dim-1 split tensors, each rank with its own small files."""
    root = tmp_path_factory.mktemp("unshard-once")
    src = write_assistant(root / "src", TINY, shards=SHARDS)
    (src / "tokenizer.json").write_bytes(os.urandom(1 << 16))
    assert run_cli("fix", src, "-o", root / "tp", "--tp", "2", "--quiet") == 0
    assert run_cli("unshard", root / "tp", "-o", root / "back") == 0
    return root / "tp"


@pytest.fixture(scope="module")
def reference(tp_out) -> dict[str, str]:
    return tree(tp_out.parent / "back")


def rank_files(tp: Path) -> list[str]:
    return sorted(p.relative_to(tp).as_posix() for p in tp.glob("rank-*/**/*") if p.is_file())


def _counted_reads(monkeypatch) -> list[tuple[str, int, int]]:
    """Every read of a file by this process (any thread), as (path, offset, bytes): pread, preadv and the kernel's
    copy_file_range (its source side)."""
    found, lock = [], threading.Lock()

    def record(fd: int, offset: int, got: int) -> None:
        with lock:
            found.append((os.readlink(f"/proc/self/fd/{fd}"), offset, got))

    real_pread, real_preadv, real_copy = os.pread, os.preadv, os.copy_file_range

    def pread(fd, n, offset):
        got = real_pread(fd, n, offset)
        record(fd, offset, len(got))
        return got

    def preadv(fd, buffers, offset, *rest):
        got = real_preadv(fd, buffers, offset, *rest)
        record(fd, offset, got)
        return got

    def copy_file_range(src, dst, count, offset_src=None, offset_dst=None):
        got = real_copy(src, dst, count, offset_src, offset_dst)
        record(src, offset_src, got)
        return got

    monkeypatch.setattr(os, "pread", pread)
    monkeypatch.setattr(os, "preadv", preadv)
    monkeypatch.setattr(os, "copy_file_range", copy_file_range)
    return found


def test_every_byte_of_every_rank_file_is_read_exactly_once(tp_out, reference, tmp_path, monkeypatch):
    reads = _counted_reads(monkeypatch)
    assert run_cli("unshard", tp_out, "-o", tmp_path / "out") == 0
    monkeypatch.undo()
    assert tree(tmp_path / "out") == reference
    for name in rank_files(tp_out):
        path = tp_out / name
        spans = sorted((offset, offset + n) for where, offset, n in reads if where == str(path.resolve()) and n)
        size = path.stat().st_size
        assert sum(end - start for start, end in spans) == size, f"{name}: {sum(e - s for s, e in spans)} bytes read of {size}"
        covered = 0
        for start, end in spans:
            assert start == covered, f"{name}: bytes [{min(start, covered)}, {max(start, covered)}) read twice or never"
            covered = end
        assert covered == size


def _refused(capsys, tp: Path, out: Path, name: str) -> str:
    before, siblings = tree(tp), sorted(p.name for p in out.parent.iterdir())
    code, _, err = run_captured(capsys, "unshard", tp, "-o", out)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert name in err and "sha256 differs from tp_manifest.json" in err, err
    assert not out.exists()
    assert sorted(p.name for p in out.parent.iterdir()) == siblings, "a temp folder was left beside OUT"
    assert tree(tp) == before, "the input changed"
    return err


def _flip(path: Path, offset: int, mask: int = 0x01) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= mask
    path.write_bytes(bytes(data))


def _places(tp: Path) -> dict[str, tuple[str, int, int]]:
    """Named bytes to change: (rank file, offset, xor mask)."""
    manifest = json.loads((tp / "tp_manifest.json").read_text())
    rank1 = read_header(tp / "rank-1" / "model.safetensors")
    raw = (tp / "rank-1" / "model.safetensors").read_bytes()[:rank1.data_start]
    by_dim = {}
    for name, entry in manifest["tensors"].items():
        info = rank1.by_name()[name]
        if info.nbytes:
            by_dim.setdefault(entry["dim"], info)
    return {
        "header length": ("rank-1/model.safetensors", 0, 0x01),
        "header padding (a space made a tab: the header still parses the same)": ("rank-1/model.safetensors", raw.rindex(b" "), 0x20 ^ 0x09),
        "header metadata": ("rank-0/model.safetensors", raw.index(b'"tp_rank"') + 2, 0x01),
        "a replicated tensor on rank 1 (never read for the rebuild)": ("rank-1/model.safetensors", by_dim[None].start + 1, 0x01),
        "a dim-0 slice (copied by the kernel)": ("rank-1/model.safetensors", by_dim[0].end - 1, 0x80),
        "a dim-1 slice (interleaved through a buffer)": ("rank-1/model.safetensors", by_dim[1].start, 0x80),
        "the last byte of rank 0": ("rank-0/model.safetensors", (tp / "rank-0" / "model.safetensors").stat().st_size - 1, 0x01),
        "rank 1's config (rank 0's is the one copied)": ("rank-1/config.json", 3, 0x01),
        "rank 0's tokenizer (copied)": ("rank-0/tokenizer.json", 100, 0x01),
    }


@pytest.mark.parametrize("place", ["header length", "header padding (a space made a tab: the header still parses the same)",
                                   "header metadata", "a replicated tensor on rank 1 (never read for the rebuild)",
                                   "a dim-0 slice (copied by the kernel)", "a dim-1 slice (interleaved through a buffer)",
                                   "the last byte of rank 0", "rank 1's config (rank 0's is the one copied)",
                                   "rank 0's tokenizer (copied)"])
def test_a_changed_byte_anywhere_in_a_rank_file_is_refused_with_nothing_written(place, tp_out, tmp_path, capsys):
    tp = tmp_path / "tp"
    shutil.copytree(tp_out, tp)
    name, offset, mask = _places(tp)[place]
    _flip(tp / name, offset, mask)
    _refused(capsys, tp, tmp_path / "out", name)


@given(data=st.data())
@SOME
def test_any_one_changed_byte_of_any_rank_file_is_refused(tp_out, capsys, data):
    root = Path(tempfile.mkdtemp(prefix="unshard-flip-"))
    try:
        tp = root / "tp"
        shutil.copytree(tp_out, tp)
        name = data.draw(st.sampled_from(rank_files(tp)))
        offset = data.draw(st.integers(0, (tp / name).stat().st_size - 1))
        _flip(tp / name, offset, data.draw(st.integers(1, 255)))
        _refused(capsys, tp, root / "out", name)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_rank_digests_use_a_bounded_number_of_threads_whatever_tp_the_manifest_says(tmp_path, monkeypatch):
    """tp comes from a shared manifest (hostile: up to 4096): the rank files' hashing threads are bounded by the
    machine, not by tp, so no manifest can exhaust the threads a container allows (that would be a traceback)."""
    src = write_assistant(tmp_path / "src", replace(TINY, heads=8, backbone=512, hidden=256, intermediate=1024))
    tp = 8
    assert run_cli("fix", src, "-o", tmp_path / "tp", "--tp", str(tp), "--quiet") == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    started, real_start = [], threading.Thread.start

    def counted(self):
        if self.name.startswith("sha256"):
            started.append(self.name)
        return real_start(self)
    monkeypatch.setattr(threading.Thread, "start", counted)
    assert run_cli("unshard", tmp_path / "tp", "-o", tmp_path / "out") == 0
    monkeypatch.undo()
    outputs = len(json.loads((tmp_path / "out" / "repair_report.json").read_text())["outputs"])
    assert len(started) <= outputs + 2, f"{len(started)} hashing threads for tp {tp}, {outputs} output files"
    assert run_cli("fix", src, "-o", tmp_path / "fixed", "--quiet") == 0
    same = {n for n in tree(tmp_path / "fixed")} - {"repair_report.json"}
    assert {n: h for n, h in tree(tmp_path / "out").items() if n in same} == {n: h for n, h in tree(tmp_path / "fixed").items() if n in same}


@pytest.mark.parametrize("sizes", [True, False], ids=["manifest with sizes", "manifest without sizes"])
def test_a_huge_sparse_rank_file_is_refused_without_reading_it_through(sizes, tp_out, tmp_path, capsys, monkeypatch):
    """A rank file grown to a terabyte (sparse: `truncate -s 1T`, no disk used) cannot be what `fix --tp` wrote: its
    size is not the manifest's, and (a manifest without sizes) past anything its tensors and a header can fill. It is
    refused at once, in one line naming it, without hashing a terabyte of zeros to say so (a hang in all but name)."""
    tp = tmp_path / "tp"
    shutil.copytree(tp_out, tp)
    if not sizes:
        manifest = json.loads((tp / "tp_manifest.json").read_text())
        for rank in manifest["ranks"]:
            del rank["sizes"]
        (tp / "tp_manifest.json").write_text(json.dumps(manifest))
    huge = tp / "rank-1" / "model.safetensors"
    os.truncate(huge, 1 << 40)
    read, real_preadv = [0], os.preadv

    def bounded(fd, buffers, offset, *rest):
        got = real_preadv(fd, buffers, offset, *rest)
        read[0] += got
        if read[0] > 1 << 30:
            raise KeyboardInterrupt  # stops the run here: a GiB read already fails the test below
        return got
    monkeypatch.setattr(os, "preadv", bounded)
    code, _, err = run_captured(capsys, "unshard", tp, "-o", tmp_path / "out")
    monkeypatch.undo()
    assert read[0] <= 1 << 30, f"{read[0]} bytes read to refuse a sparse terabyte"
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(huge) in err and "re-run `fix --tp`" in err, err
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tp"]


def test_a_rank_file_truncated_behind_a_shared_hashing_thread_is_the_one_named(tmp_path, capsys, monkeypatch):
    """Ranks share hashing threads (one per core). When rank 2's file is truncated after the rebuild read its slices
    but before its thread hashed the gaps (a replicated tensor it never copies), the thread's error must not be
    blamed on rank 0, whose digest is finished first on the same thread: the line names the file that changed."""
    from repair.io import hashing
    from repair.tp import rank_digests
    src = write_assistant(tmp_path / "src", replace(TINY, heads=8, backbone=512, hidden=256, intermediate=1024))
    assert run_cli("fix", src, "-o", tmp_path / "tp", "--tp", "4", "--quiet") == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # two threads: ranks 0 and 2 share one
    rank2 = tmp_path / "tp" / "rank-2" / "model.safetensors"
    release, real_update, real_check = threading.Event(), hashing.SourceDigest._update, rank_digests.RankDigests.check

    def held(self, offset, view):
        if self.pinned.path == rank2:
            release.wait(30)  # rank 2's hashing waits until the rebuild is done
        return real_update(self, offset, view)

    def check(self, pins, copied):
        os.truncate(rank2, read_header(rank2).data_start)  # after every read of the rebuild, before the hashing
        release.set()
        return real_check(self, pins, copied)
    monkeypatch.setattr(hashing.SourceDigest, "_update", held)
    monkeypatch.setattr(rank_digests.RankDigests, "check", check)
    code, _, err = run_captured(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "out")
    release.set()
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(rank2) in err and "rank-0" not in err, err
    assert not (tmp_path / "out").exists()


def test_a_rank_file_truncated_under_an_interleaved_read_is_named(tp_out, tmp_path, capsys, monkeypatch):
    """A rank file cut short as a dim-1 slice is read row by row (through a buffer, not the kernel copy): one line
    naming that rank file (not only the tensor), exit 2, nothing beside OUT."""
    from repair.tp import unshard
    tp = tmp_path / "tp"
    shutil.copytree(tp_out, tp)
    rank1 = tp / "rank-1" / "model.safetensors"
    real_concat = unshard._concat

    def cut(out, entry, parts):
        if entry["dim"] not in (None, 0) and rank1.stat().st_size > read_header(rank1).data_start:
            os.truncate(rank1, read_header(rank1).data_start)
        return real_concat(out, entry, parts)
    monkeypatch.setattr(unshard, "_concat", cut)
    code, _, err = run_captured(capsys, "unshard", tp, "-o", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(rank1) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tp"]


@pytest.mark.parametrize("name", ["rank-0/tokenizer.json", "rank-1/config.json"])
def test_a_small_rank_file_grown_sparse_is_refused_before_it_is_copied_or_hashed(name, tp_out, tmp_path, capsys, monkeypatch):
    """Rank 0's small files are copied while they are hashed (read once), so one grown sparse to a terabyte would be
    written out whole (filling the disk) before its sha256 refused it; another rank's is hashed through. The manifest
    records every rank file's size: a file of another size is refused by a stat, before anything is read or written."""
    tp = tmp_path / "tp"
    shutil.copytree(tp_out, tp)
    os.truncate(tp / name, 1 << 40)
    moved, real_copy, real_preadv = [0], os.copy_file_range, os.preadv

    def guard(got: int) -> int:
        moved[0] += got
        if moved[0] > 1 << 30:
            raise KeyboardInterrupt  # stops the run before the disk fills: a GiB moved already fails the test below
        return got
    monkeypatch.setattr(os, "copy_file_range", lambda *a: guard(real_copy(*a)))
    monkeypatch.setattr(os, "preadv", lambda *a: guard(real_preadv(*a)))
    code, _, err = run_captured(capsys, "unshard", tp, "-o", tmp_path / "out")
    monkeypatch.undo()
    assert moved[0] <= 1 << 30, f"{moved[0]} bytes copied or read to refuse a sparse terabyte"
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert str(tp / name) in err and "re-run `fix --tp`" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tp"]


def _reordered(tp_out: Path, root: Path, how: str) -> Path:
    """A copy of `tp_out` whose manifest (hand-edited, still valid) lists the tensors in another order than the rank
    files store them: each shard's list reversed (its header written canonically from the list), or the shards swapped."""
    tp = root / "tp"
    shutil.copytree(tp_out, tp)
    manifest = json.loads((tp / "tp_manifest.json").read_text())
    shards = manifest["standard"]["shards"]
    if how == "tensors reversed":
        for shard in shards:
            shard.pop("header", None)
            shard["tensors"].reverse()
    else:
        shards.reverse()
    (tp / "tp_manifest.json").write_text(json.dumps(manifest))
    return tp


@pytest.mark.parametrize("how", ["tensors reversed", "shards reversed"])
def test_a_manifest_listing_tensors_backwards_still_reads_every_byte_once(how, tp_out, tmp_path, monkeypatch):
    """The rebuild follows the rank files' own order and writes each tensor at its place in the output: a manifest
    whose order goes backwards in a rank file (hand-edited, still valid) does not make unshard hash that file again.
    The output is the manifest's: the same tensors, each with the same bytes, in the manifest's order."""
    from safetensors.torch import load_file

    tp = _reordered(tp_out, tmp_path, how)
    assert len(json.loads((tp / "tp_manifest.json").read_text())["standard"]["shards"]) > 1
    reads = _counted_reads(monkeypatch)
    assert run_cli("unshard", tp, "-o", tmp_path / "out") == 0
    monkeypatch.undo()
    for name in rank_files(tp):
        path = (tp / name).resolve()
        spans = sorted((offset, offset + n) for where, offset, n in reads if where == str(path) and n)
        assert sum(e - s for s, e in spans) == path.stat().st_size, f"{name}: {sum(e - s for s, e in spans)} bytes read of {path.stat().st_size}"
    manifest = json.loads((tp / "tp_manifest.json").read_text())
    for shard in manifest["standard"]["shards"]:
        assert list(read_header(tmp_path / "out" / shard["name"]).by_name()) == shard["tensors"]
        rebuilt, before = load_file(tmp_path / "out" / shard["name"]), load_file(tp_out.parent / "back" / shard["name"])
        assert rebuilt.keys() == before.keys() and all(rebuilt[k].equal(before[k]) for k in before)
