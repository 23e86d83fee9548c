"""`doctor --deep` on a local checkpoint scans every block scale in chunks through one buffer (#27: at the speed of
`cat`): a bad code anywhere, also past the first chunk, is counted exactly as stats_of counts it, and a shard that
ends inside a tensor is one line naming it."""

from __future__ import annotations

import os

import pytest

from repair.doctor import scales
from repair.errors import BadInput
from repair.formats.nvfp4_health import stats_of
from repair.io.safetensors import TensorInfo


def _scan(path, infos, keep=frozenset()):
    out = {}
    scales._scan_shard(set(keep), path, infos, lambda info, stats: out.__setitem__(info.name, stats))
    return out


@pytest.mark.parametrize("where", [0, 100, 4095, 4096, 9000, 12287])
@pytest.mark.parametrize("code", [0x00, 0x7F, 0xFF, 0x80, 0xB0])
def test_a_bad_code_anywhere_is_counted_as_stats_of_counts_it(tmp_path, monkeypatch, where, code):
    monkeypatch.setattr(scales, "SCAN_CHUNK", 4096)  # three chunks per tensor
    data = bytearray(b"\x38" * 12288)
    data[where] = code
    path = tmp_path / "s.bin"
    path.write_bytes(b"\x38" * 8 + bytes(data))
    infos = [TensorInfo("a.weight_scale", "F8_E4M3", (12288,), 8, 8 + 12288, path), TensorInfo("b", "F8_E4M3", (8,), 0, 8, path)]
    got = _scan(path, infos)
    assert got["a.weight_scale"] == stats_of(bytes(data)) and got["b"] == stats_of(b"\x38" * 8)
    kept = _scan(path, infos, keep={"a.weight_scale"})["a.weight_scale"]
    assert kept.raw == bytes(data)  # a module whose value checks need every code keeps them


def test_a_shard_ending_inside_a_tensor_is_one_line(tmp_path):
    path = tmp_path / "s.bin"
    path.write_bytes(b"\x38" * 100)
    with pytest.raises(BadInput, match=r"s.bin: x.weight_scale: file ended while reading; it is truncated"):
        _scan(path, [TensorInfo("x.weight_scale", "F8_E4M3", (200,), 0, 200, path)])
    os.truncate(path, 0)
    with pytest.raises(BadInput, match="file ended while reading"):
        _scan(path, [TensorInfo("x.weight_scale", "F8_E4M3", (200,), 0, 200, path)])
