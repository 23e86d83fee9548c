"""#27.1: doctor reads what the verdict needs. By default the per-tensor scalars and a sample of each NVFP4 block-scale
tensor (its first and last 64 bytes); `--deep` reads every block scale. Measured on a DeepSeek-R1-shaped checkpoint
(real shapes: 917,504-byte block-scale tensors) with the kernel's own count of bytes read (/proc/self/io rchar)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest
from safetensors.numpy import save_file

from repair.doctor.diagnose import diagnose
from repair.io.checkpoint import open_checkpoint
from repair.targets.profiles import resolve
from tests.conftest import run_captured
from tools.bench import sparse_r1

DOWN = "model.layers.1.mlp.experts.2.down_proj.weight_scale"


def small_r1(folder: Path) -> Path:
    """Layers 0 (dense) and 1-2 (MoE, 4 experts) at DeepSeek-R1's real shapes, every block-scale byte real."""
    return sparse_r1.write(folder, layers=3, experts=4, dense=1, shards=4, blocks="all")


def rchar() -> int:
    return int(next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1])


def corrupt(folder: Path, name: str, at: slice, code: int) -> None:
    ckpt = open_checkpoint(folder)
    shard, info = ckpt.locate()[name]
    start, stop, _ = at.indices(info.nbytes)
    with open(shard.path, "r+b") as fh:
        os.pwrite(fh.fileno(), bytes([code]) * (stop - start), info.start + start)


def doctor_json(capsys, folder: Path, *flags: str) -> tuple[int, dict]:
    code, out, _ = run_captured(capsys, "doctor", folder, "--json", *flags)
    return code, json.loads(out)


def block_findings(report: dict) -> dict[str, str]:
    return {f["subject"]: f["message"] for f in report["findings"] if f["code"] == "block-scales"}


def test_default_doctor_reads_a_sample_and_deep_reads_every_block_scale(tmp_path):
    ckpt = open_checkpoint(small_r1(tmp_path / "r1"))
    total = sum(i.nbytes for i in ckpt.infos().values() if i.dtype == "F8_E4M3")
    assert total > 70e6
    before = rchar()
    default = diagnose(ckpt, resolve(None))
    sampled = rchar() - before
    before = rchar()
    deep = diagnose(ckpt, resolve(None), deep=True)
    scanned = rchar() - before
    assert sampled < total / 100, f"doctor read {sampled:,} bytes by default; the block scales are {total:,}"
    assert scanned >= total
    assert (default.scales.block_scales, default.scales.sampled, default.scales.read_whole) == ("sampled", 39, 0)
    assert (deep.scales.block_scales, deep.scales.read_whole, deep.scales.bytes_read) == ("scanned", 39, total)
    assert default.findings == deep.findings  # healthy block scales: the same verdict


@pytest.mark.parametrize("what,at,code,severity", [
    ("a tensor of NaN", slice(None), 0x7F, "error"),
    ("a tensor of negatives", slice(None), 0xB8, "error"),
    ("a tensor of zeros", slice(None), 0x00, "warning"),
    ("a zeroed tail (a cut-short download)", slice(600_000, None), 0x00, "warning"),
])
def test_the_sample_catches_what_matters(capsys, tmp_path, what, at, code, severity):
    folder = small_r1(tmp_path / "r1")
    corrupt(folder, DOWN, at, code)
    _, report = doctor_json(capsys, folder)
    assert DOWN in block_findings(report), what
    assert "in a sample of 128 of 917504 (doctor --deep counts them all)" in block_findings(report)[DOWN]
    assert {f["severity"] for f in report["findings"] if f["subject"] == DOWN} == {severity}
    assert report["scale_checks"]["block_scales"] == "sampled"


def test_one_bad_block_inside_a_tensor_needs_deep(capsys, tmp_path):
    folder = small_r1(tmp_path / "r1")
    corrupt(folder, DOWN, slice(400_000, 400_001), 0x7F)
    code, report = doctor_json(capsys, folder)
    assert DOWN not in block_findings(report)
    code, out, _ = run_captured(capsys, "doctor", folder)
    assert "block scales were not scanned (sampled the first and last 64 bytes of each of 39 tensor(s)); " \
           "run with --deep to scan all 76.4 MB" in out.splitlines()
    code, report = doctor_json(capsys, folder, "--deep")
    assert code == 1 and block_findings(report)[DOWN] == f"{DOWN}: 1 NaN and 0 negative block scales"
    assert report["scale_checks"] | {"scalars": 0} == {
        "block_scales": "scanned", "tensors": 39, "sampled": 0, "read_whole": 39, "total_bytes": 76_382_208,
        "bytes_read": 76_382_208, "source": "disk", "requests": 0, "scalars": 0, "sample_bytes": 64}
    assert report["scale_checks"]["scalars"] == 2 * 39  # weight_scale_2 and input_scale of every packed module
    code, out, _ = run_captured(capsys, "doctor", folder, "--deep")
    assert "block scales scanned: every byte of 39 tensor(s), 76.4 MB" in out.splitlines()


def test_a_global_scale_that_may_overflow_has_its_block_scales_read_whole(tmp_path):
    """Only the largest block scale tells whether such a global scale overflows: that module's are read whole."""
    folder = small_r1(tmp_path / "r1")
    ckpt = open_checkpoint(folder)
    shard, info = ckpt.locate()[DOWN + "_2"]
    with open(shard.path, "r+b") as fh:
        os.pwrite(fh.fileno(), struct.pack("<f", 1e36), info.start)
    found = diagnose(open_checkpoint(folder), resolve(None))
    assert (found.scales.read_whole, found.scales.sampled) == (1, 38)
    assert [f.subject for f in found.findings if f.code == "scale-overflow"] == [DOWN + "_2"]


def test_the_sparse_r1_is_laid_out_as_safetensors_writes_a_shard(tmp_path):
    """The benchmark's layout claim: scalars first, then BF16, block scales, packed weights; each run by name."""
    import numpy as np

    names = sparse_r1.tensors(layers=2, experts=2, dense=1)[:40]
    arrays = {n: np.zeros(1 if not shape else 2, dtype={"F32": np.float32, "BF16": np.float16, "F8_E4M3": np.int8,
                                                      "U8": np.uint8}[dtype]) for n, dtype, shape in names}
    save_file(arrays, str(tmp_path / "ref.safetensors"))
    theirs = [t.name for t in open_checkpoint(tmp_path).shards[0].tensors]
    order = {"F32": 0, "BF16": 1, "F8_E4M3": 2, "U8": 3}
    ours = [n for n, _, _ in sorted(names, key=lambda t: (order[t[1]], t[0]))]
    # float16 stands in for BF16 and int8 for float8 (numpy has neither); their alignments order the same way
    assert theirs == ours


@pytest.mark.parametrize("deep", [False, True])
def test_several_targets_read_the_block_scales_once(capsys, tmp_path, deep):
    """The block scales are the checkpoint's, not a target's: `--target a,b,c` reads (and `--deep` scans) them once."""
    folder = small_r1(tmp_path / "r1")
    ckpt = open_checkpoint(folder)
    total = sum(i.nbytes for i in ckpt.infos().values() if i.dtype == "F8_E4M3")
    flags = ("--deep",) if deep else ()
    before = rchar()
    _, one = doctor_json(capsys, folder, *flags)
    alone = rchar() - before
    before = rchar()
    _, three = doctor_json(capsys, folder, "--target", "vllm==0.32.0,sglang==0.5.23,trtllm==1.1", *flags)
    several = rchar() - before
    if deep:
        assert alone >= total and several < alone + total / 2, f"3 targets read {several:,} bytes, one {alone:,}"
    assert several < 1.5 * alone, f"3 targets read {several:,} bytes, one {alone:,}"
    read = lambda checks: {k: v for k, v in checks.items() if k != "scalars"}  # noqa: E731 (a target's checks ask their own scalars)
    assert [read(t["scale_checks"]) for t in three["targets"]] == [read(one["scale_checks"])] * 3  # each says what was read
