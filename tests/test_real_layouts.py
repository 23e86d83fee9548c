"""Shard layout never matters (issue 15), on a published checkpoint's names and shard assignment: the real
Llama 3.1 8B NVFP4 index (tests/data/real, ModelOpt 0.37, FP8 KV cache), as published and with modules split
across its two shards, gives bitwise the single-file output for every fix."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import run_captured
from tools.real_fixture import real_weight_map, write_llama

REAL = "llama-3.1-8b-instruct-fp4"
FIRST, SECOND = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"


def moved(weight_map: dict[str, str]) -> dict[str, str]:
    """Layer 5's input scales in shard 1 and the rest in shard 2; layer 20 the other way round."""
    out = dict(weight_map)
    for name in out:
        if name.startswith(("model.layers.5.", "model.layers.20.")):
            first = name.endswith("input_scale") == name.startswith("model.layers.5.")
            out[name] = FIRST if first else SECOND
    return out


def stored(folder: Path) -> dict[str, tuple]:
    """Every tensor's dtype, shape and sha256 of its bytes, read from the files (and the index agreeing)."""
    found, where = {}, {}
    for shard in sorted(folder.glob("*.safetensors")):
        data = shard.read_bytes()
        size = int.from_bytes(data[:8], "little")
        for name, entry in json.loads(data[8:8 + size]).items():
            if name != "__metadata__":
                start, end = entry["data_offsets"]
                found[name] = (entry["dtype"], entry["shape"], hashlib.sha256(data[8 + size + start:8 + size + end]).hexdigest())
                where[name] = shard.name
    index = folder / "model.safetensors.index.json"
    if index.exists():
        assert json.loads(index.read_text())["weight_map"] == where
    return found


@pytest.fixture(scope="module")
def layouts(tmp_path_factory):
    root = tmp_path_factory.mktemp("real-layouts")
    real = real_weight_map(REAL)
    return {"single": write_llama(root / "single", REAL, {n: "model.safetensors" for n in real}),
            "published": write_llama(root / "published", REAL, real),
            "moved": write_llama(root / "moved", REAL, moved(real))}


@pytest.mark.parametrize("flags", [["--target", "bf16"], ["--recipe", "modelopt-dequantize-mlp"]], ids=["bf16", "mlp-recipe"])
def test_every_layout_of_a_real_index_gives_the_single_file_output(layouts, tmp_path, capsys, flags):
    outputs = {}
    for name, src in layouts.items():
        code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / name, "--quiet", *flags)
        assert code == 0, err
        outputs[name] = stored(tmp_path / name)
    assert outputs["published"] == outputs["single"]
    assert outputs["moved"] == outputs["single"]
    assert any(v[0] == "BF16" and "mlp.down_proj.weight" in k for k, v in outputs["single"].items())
