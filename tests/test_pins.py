"""#25.1/#25.2: inputs pinned at plan time; the report's hashes are those of the bytes read and written.

Each test changes SRC after `make_plan` and before `execute` (the planned files are then read at
plan-time offsets): the run must refuse (exit 2, BadInput) and publish nothing, or its output must
be what the planned SRC gives. tests/test_mutation.py changes SRC at other moments, mid-read.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from pathlib import Path

import pytest

from repair.demo.examples import TINY, write_assistant
from repair.errors import BadInput
from repair.execute.writer import execute
from repair.io.checkpoint import open_checkpoint
from repair.planning.build import make_plan
from repair.planning.recipe import Recipe

SHARDS = [["pre_projection"], ["post_projection"]]  # shard 1 copied whole, shards 2 and 3 rewritten


def sha(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tensor_ranges(path: Path) -> list[tuple[int, int]]:
    """Absolute byte ranges of a safetensors file's tensors, largest first."""
    raw = Path(path).read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    header.pop("__metadata__", None)
    ranges = [(8 + length + e["data_offsets"][0], 8 + length + e["data_offsets"][1]) for e in header.values()]
    return sorted(ranges, key=lambda r: (r[0] - r[1], r[0]))


def swapped(path: Path) -> bytes:
    """The file's bytes with two same-size tensors' data swapped (a valid file, same header, same size); a file
    without two such tensors gets its largest tensor's bytes reversed instead."""
    data = bytearray(Path(path).read_bytes())
    ranges = tensor_ranges(path)
    pair = next(((a, b) for a, b in zip(ranges, ranges[1:]) if a[1] - a[0] == b[1] - b[0] >= 64
                 and data[a[0]:a[1]] != data[b[0]:b[1]]), None)
    if pair is None:
        a0, a1 = ranges[0]
        data[a0:a1] = data[a0:a1][::-1]
    else:
        (a0, a1), (b0, b1) = pair
        data[a0:a1], data[b0:b1] = data[b0:b1], data[a0:a1]
    return bytes(data)


def clean_fix(src: Path, out: Path) -> Path:
    return execute(make_plan(open_checkpoint(src), Recipe()), out, progress=False).out


def assert_refused_unpublished(plan, out: Path, name: str) -> None:
    with pytest.raises(BadInput, match=f"SRC .*while it was being read: .*{name}; nothing was published") as err:
        execute(plan, out, progress=False)
    assert "\n" not in str(err.value)
    assert not out.exists() and not [p for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.partial")]


def test_src_replaced_during_fix_is_refused(tmp_path):
    """Atomically replaced by a copy with two same-size tensors swapped: main wrote those tensors
    crossed over with exit 0, and recorded the new file's sha256."""
    src = write_assistant(tmp_path / "src", TINY)
    plan = make_plan(open_checkpoint(src), Recipe())
    target = src / "model.safetensors"
    (tmp_path / "new").write_bytes(swapped(target))
    os.replace(tmp_path / "new", target)
    assert_refused_unpublished(plan, tmp_path / "out", "model.safetensors")


def test_unchanged_shard_rewritten_in_place_is_refused(tmp_path):
    """A shard the plan copies whole is rewritten in place (same inode, same size) before it is copied."""
    src = write_assistant(tmp_path / "src", TINY, shards=SHARDS)
    plan = make_plan(open_checkpoint(src), Recipe())
    copied = next(s.name for s in plan.shards if s.op == "copy_file")
    target = src / copied
    new = swapped(target)
    with open(target, "r+b") as fh:
        fh.write(new)
    assert_refused_unpublished(plan, tmp_path / "out", copied)


def test_config_rewritten_after_planning_is_refused(tmp_path):
    """main built OUT's config from the planned config.json and recorded the new file's sha256."""
    src = write_assistant(tmp_path / "src", TINY)
    plan = make_plan(open_checkpoint(src), Recipe())
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "torch_dtype": "float32"}))
    assert_refused_unpublished(plan, tmp_path / "out", "config.json")


def test_report_records_the_bytes_read_and_written(tmp_path):
    """Unchanged SRC: every output hash in the report is its file's, every source hash its input's, and
    a whole-shard copy's output hash equals its source's."""
    src = write_assistant(tmp_path / "src", TINY, shards=SHARDS)
    out = clean_fix(src, tmp_path / "out")
    report = json.loads((out / "repair_report.json").read_text())
    assert {o["name"]: o["sha256"] for o in report["outputs"]} == {n: sha(out / n) for n in (o["name"] for o in report["outputs"])}
    sources = {f["name"]: f["sha256"] for f in report["source"]["files"]}
    assert sources and sources == {n: sha(src / n) for n in sources}
    first = "model-00001-of-00003.safetensors"
    assert sources[first] == sha(out / first)


def test_a_change_after_the_last_read_of_another_file_still_refuses(tmp_path):
    """The check covers every pinned file, including the small files copied through (generation_config.json)."""
    src = write_assistant(tmp_path / "src", TINY)
    plan = make_plan(open_checkpoint(src), Recipe())
    (src / "generation_config.json").write_text('{"bos_token_id": 7}')
    assert_refused_unpublished(plan, tmp_path / "out", "generation_config.json")


def test_original_replaced_after_planning_is_refused(broken_export, original_model, tmp_path):
    """--original is pinned like SRC: even a byte-identical copy renamed over it is another file."""
    import shutil

    from repair import api

    original = shutil.copytree(original_model, tmp_path / "orig")
    plan = api.plan(broken_export, original=original)
    shard = next(original.glob("*.safetensors"))
    shutil.copyfile(shard, tmp_path / "copy")
    os.replace(tmp_path / "copy", shard)
    with pytest.raises(BadInput, match=f"--original was replaced while it was being read: .*{shard.name}; nothing was published"):
        api.run(plan, tmp_path / "out")
    assert not (tmp_path / "out").exists()
