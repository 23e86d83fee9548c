"""Multi-shard inputs: changed tensors in different shards, untouched shards copied whole, index rewritten."""

from __future__ import annotations

import hashlib

import torch

from repair.demo.examples import GEMMA4_31B, TINY, write_assistant
from repair.execute.writer import execute
from repair.io.checkpoint import open_checkpoint
from repair.planning.build import make_plan
from repair.planning.recipe import Recipe
from tests.conftest import load_tensors, raw_bytes, read_json


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def fix(src, out):
    return execute(make_plan(open_checkpoint(src), Recipe()), out, progress=False)


def test_changed_tensors_in_different_shards(tmp_path):
    src = write_assistant(tmp_path / "src", TINY, shards=[["pre_projection"], ["post_projection"]])
    single = write_assistant(tmp_path / "single", TINY)
    files = sorted(p.name for p in src.glob("*.safetensors"))
    assert files == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    plan = make_plan(open_checkpoint(src), Recipe())
    assert {s.name: s.op for s in plan.shards} == {files[0]: "copy_file", files[1]: "rewrite", files[2]: "rewrite"}
    out = fix(src, tmp_path / "out").out
    assert sha(out / files[0]) == sha(src / files[0]), "an untouched shard was not copied whole"
    got, want = load_tensors(out), load_tensors(fix(single, tmp_path / "single-out").out)
    assert got.keys() == want.keys()
    assert all(raw_bytes(got[k]) == raw_bytes(want[k]) for k in got)
    index = read_json(out / "model.safetensors.index.json")
    assert index["weight_map"]["pre_projection.weight"] == files[1]
    assert index["weight_map"]["post_projection.weight"] == files[2]
    assert set(index["weight_map"]) == set(got)
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in got.values())


def test_realistic_31b_shapes(tmp_path):
    dims = GEMMA4_31B.__class__(**{**GEMMA4_31B.__dict__, "vocab": 4096})  # real linear shapes, small vocab
    src = write_assistant(tmp_path / "src", dims, shards=[["model.layers.2", "model.layers.3", "post_projection"]])
    out = fix(src, tmp_path / "out").out
    got = load_tensors(out)
    assert got["pre_projection.weight"].shape == (1024, 10752) and got["pre_projection.weight"].dtype == torch.bfloat16
    assert got["post_projection.weight"].shape == (5376, 1024)
    assert got["model.layers.0.mlp.down_proj.weight"].shape == (1024, 4096)  # still packed
    assert got["model.layers.3.self_attn.o_proj.weight"].shape == (1024, 8192)
