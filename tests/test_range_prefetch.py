"""doctor reads every module's scalars (weight_scale_2, input_scale): 135k of them on DeepSeek-R1 (#27). They are read
ahead a run at a time (io/ranges.py RangeReader.prefetch): the bytes served are the file's, a run costs one read,
and a file that ends early still gets its one line when a scalar past its end is asked for."""

from __future__ import annotations

import os
import struct

import pytest

from repair.errors import BadInput
from repair.io import ranges
from repair.io.ranges import RangeReader
from repair.io.safetensors import TensorInfo


def _file(path, count: int, spacing: int):
    data = bytearray(count * spacing + 4)
    infos = []
    for i in range(count):
        data[i * spacing:i * spacing + 4] = struct.pack("<f", i + 0.5)
        infos.append(TensorInfo(f"m{i}.weight_scale_2", "F32", (), i * spacing, i * spacing + 4, path))
    path.write_bytes(bytes(data))
    return path, infos


def test_prefetched_scalars_are_the_files_bytes_read_a_run_at_a_time(tmp_path, monkeypatch):
    path, infos = _file(tmp_path / "near.bin", 3000, 4)  # 3000 scalars side by side, as safetensors lays them out
    _, far = _file(tmp_path / "far.bin", 3, 1 << 16)  # 64 KiB apart: a run each
    reads = []
    real = os.pread
    monkeypatch.setattr(ranges.os, "pread", lambda fd, n, at: reads.append(n) or real(fd, n, at))
    with RangeReader() as read:
        read.prefetch(infos + far)
        assert len(reads) == 1 + 3
        reads.clear()
        got = [struct.unpack("<f", read(i.path, i)[:4])[0] for i in infos + far]
        assert got == [i + 0.5 for i in range(3000)] + [0.5, 1.5, 2.5] and reads == []


def test_a_file_ending_inside_a_run_still_names_the_tensor(tmp_path):
    path, infos = _file(tmp_path / "short.bin", 10, 4)
    os.truncate(path, 20)  # the last five scalars are gone
    with RangeReader() as read:
        read.prefetch(infos)
        assert read(path, infos[0])[:4] == struct.pack("<f", 0.5)
        with pytest.raises(BadInput, match="m9.weight_scale_2: file ended while reading"):
            read(path, infos[9])
