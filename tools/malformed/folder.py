"""Cases that break the checkpoint folder around the shards: duplicate or missing shards, the index,
symlinks, pickle or absent weights, a file given where a folder belongs.
"""

from __future__ import annotations

import pickle

from .edits import INDEX, ONE, SHARD_1, SHARD_2, SHARD_3, _edit_json, assistant
from .registry import Case, case


@case
def duplicate_across_shards(work):  # a stale copy of a shard left beside the new one
    src = assistant(work, sharded=True)
    (src / "model-00002-of-00003.old.safetensors").write_bytes((src / SHARD_2).read_bytes())
    return Case(src, "is stored in both model-00002-of-00003.old.safetensors and model-00002-of-00003.safetensors")


@case
def index_names_missing_shard(work):
    src = assistant(work, sharded=True)
    (src / SHARD_3).unlink()
    return Case(src, f"{SHARD_3}: named in the index but missing; download the missing shard")


@case
def index_missing_tensor(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i["weight_map"].pop("post_projection.weight_scale"))
    return Case(src, f"post_projection.weight_scale is in {SHARD_3} but the index does not list it")


@case
def index_lists_unstored_tensor(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i["weight_map"].update({"lm_head.weight": SHARD_1}))
    return Case(src, "tensor lm_head.weight is listed in the index but not stored")


@case
def index_invalid_json(work):
    src = assistant(work, sharded=True)
    (src / INDEX).write_text('{"weight_map": {')
    return Case(src, f"{INDEX}: invalid JSON at line 1")


@case
def index_without_weight_map(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i.pop("weight_map"))
    return Case(src, f"{INDEX}: missing or invalid 'weight_map'")


@case
def index_bad_metadata(work):
    src = assistant(work, sharded=True)
    _edit_json(src / INDEX, lambda i: i.update(metadata=[["total_size", 1]]))
    return Case(src, f"{INDEX}: 'metadata' is not an object")


@case
def symlink_outside(work):
    src = assistant(work)
    (work / "elsewhere.json").write_text("{}")
    (src / "tokenizer.json").symlink_to(work / "elsewhere.json")
    return Case(src, "tokenizer.json: symlink points outside the checkpoint folder")


@case
def symlink_dangling(work):
    src = assistant(work)
    (src / "tokenizer.json").symlink_to(src / "gone.json")
    return Case(src, "tokenizer.json: symlink is broken")


@case
def pickle_checkpoint(work):  # never unpickled: loading a pickle can run code
    src = work / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "pytorch_model.bin").write_bytes(pickle.dumps({"weight": [0.0]}))
    return Case(src, "pytorch_model.bin: pickle checkpoints are refused (loading them can run code); convert to safetensors")


@case
def no_safetensors(work):
    src = work / "src"
    src.mkdir()
    (src / "config.json").write_text("{}")
    return Case(src, "no .safetensors files found")


@case
def src_not_a_folder(work):
    src = assistant(work)
    return Case(src / ONE, f"{ONE}: not a folder")
