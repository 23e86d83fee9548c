"""Shard layout never changes what the tool does (issue 15).

Real checkpoints are sharded by size, so a shard boundary can fall between any two tensors of a
module, and exporters write tensors in any order. These tests re-shard real exports (ModelOpt's,
and compressed-tensors' own conversion of it) into up to three shards, every tensor in any shard
and at any place in it, and require bitwise the single-shard checkpoint's output tensors from
every `fix`, from `fix --tp 2` then `unshard`, and that `--dry-run` accepts exactly what the
writer writes. The shards are written byte by byte here (not by our writer, not by safetensors,
which sorts tensors), and outputs are read back with the safetensors library.
"""

from __future__ import annotations

import json
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import load_tensors, raw_bytes, run_captured, tree_hashes

MODELOPT_MODES = ("default", "vllm==0.22.1", "bf16", "original", "requantize")
CT_MODES = ("default", "vllm==0.22.1", "bf16")  # --original / --requantize are refused for compressed-tensors by design
FORMATS = {"modelopt": ("broken_export", MODELOPT_MODES, True),  # (session fixture, modes, fix --tp then unshard)
           "compressed-tensors": ("ct_export", CT_MODES, False),  # --tp is refused for compressed-tensors by design
           "modelopt-mixed": ("mixed_export", ("bf16", "vllm==0.32.0"), True)}  # issue 19: FP8, W4A16, AWQ layers
REQUANTIZE = "pre_projection,model.layers.0.mlp.gate_proj"  # gate_proj brings its fused sibling up_proj
LAYOUTS = settings(max_examples=25, deadline=None, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def mode_args(mode: str, original: Path) -> tuple:
    return {"default": (), "original": ("--original", original), "requantize": ("--original", original, "--requantize", REQUANTIZE),
            }.get(mode, ("--target", mode))


def stored(path: Path) -> tuple[list[tuple[str, dict, bytes]], dict | None]:
    """A single safetensors file as (name, header entry, raw bytes) in stored order, and its metadata."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8: 8 + size])
    meta = header.pop("__metadata__", None)
    body = data[8 + size:]
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    return [(n, {"dtype": e["dtype"], "shape": e["shape"]}, body[slice(*e["data_offsets"])]) for n, e in entries], meta


def write_shard(path: Path, tensors: list[tuple[str, dict, bytes]], meta: dict | None) -> None:
    """A safetensors file holding `tensors` in exactly this order (header and data)."""
    header, offset = ({"__metadata__": meta} if meta else {}), 0
    for name, entry, raw in tensors:
        header[name] = {**entry, "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(raw for _, _, raw in tensors))


def reshard(base: Path, out: Path, shard_of: list[int], order: list[int]) -> Path:
    """`base` (one file) re-written as up to three shards: tensor i goes to shard shard_of[i]; within a
    shard, tensors keep the relative order `order` gives them. Empty shards are not written."""
    tensors, meta = stored(base / "model.safetensors")
    groups = [[tensors[i] for i in order if shard_of[i] == s] for s in range(3)]
    groups = [g for g in groups if g]
    out.mkdir()
    weight_map = {}
    for k, group in enumerate(groups):
        name = f"model-{k + 1:05d}-of-{len(groups):05d}.safetensors"
        write_shard(out / name, group, meta)
        weight_map.update({t[0]: name for t in group})
    total = sum(len(raw) for _, _, raw in tensors)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    for small in base.iterdir():
        if not small.name.endswith((".safetensors", ".index.json")):
            shutil.copyfile(small, out / small.name)
    return out


@st.composite
def layouts(draw, n: int) -> tuple[list[int], list[int]]:
    """Either any tensor in any of three shards, in any order; or the exporter's own order cut at two
    arbitrary boundaries (how save_pretrained shards by size)."""
    if draw(st.booleans()):
        return draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)), draw(st.permutations(range(n)))
    a, b = sorted(draw(st.lists(st.integers(0, n), min_size=2, max_size=2)))
    return [0] * a + [1] * (b - a) + [2] * (n - b), list(range(n))


def tensors_of(folder: Path) -> dict[str, tuple[str, tuple, bytes]]:
    return {k: (str(t.dtype), tuple(t.shape), raw_bytes(t)) for k, t in load_tensors(folder).items()}


def check_index(out: Path) -> None:
    """Read independently of ckpt-repair: every written shard is indexed, every tensor mapped to the
    shard that holds it, once; total_size is the tensors' bytes."""
    shards = {p.name: [t[0] for t in stored(p)[0]] for p in out.glob("*.safetensors")}
    names = [n for held in shards.values() for n in held]
    assert len(names) == len(set(names)), "a tensor is written twice"
    index_file = out / "model.safetensors.index.json"
    if not index_file.exists():
        assert len(shards) == 1
        return
    index = json.loads(index_file.read_text())
    assert index["weight_map"] == {n: file for file, held in shards.items() for n in held}
    assert set(index["weight_map"].values()) == set(shards), "a shard is written but not indexed (or the reverse)"
    assert index["metadata"]["total_size"] == sum(len(raw) for p in out.glob("*.safetensors") for _, _, raw in stored(p)[0])


class Runs:
    """The CLI in-process on fresh folders under one scratch root; reference outputs are computed once."""

    def __init__(self, root: Path, original: Path):
        self.root, self.original, self._refs = root, original, {}

    def folder(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.root))

    def reference(self, capsys, base: Path, mode: str) -> dict:
        key = (base, mode)
        if key not in self._refs:
            out = self.folder() / "out"
            code, _, err = run_captured(capsys, "fix", base, "-o", out, "--quiet", *mode_args(mode, self.original))
            assert code == 0, err
            self._refs[key] = tensors_of(out)
        return self._refs[key]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, original_model) -> Runs:
    return Runs(tmp_path_factory.mktemp("layouts"), original_model)


def fix_any_layout(capsys, runs: Runs, base: Path, mode: str, layout, tp: bool) -> None:
    """The property for one layout and one mode (see the module docstring)."""
    work = runs.folder()
    src = reshard(base, work / "src", *layout)
    before = tree_hashes(src)
    args = mode_args(mode, runs.original)
    code, out, err = run_captured(capsys, "fix", src, "-o", work / "out", "--dry-run", "--json", *args)
    assert code == 0, err
    planned = {f["name"] for f in json.loads(out)["plan"]["files"] if f["op"] != "remove"}
    code, _, err = run_captured(capsys, "fix", src, "-o", work / "out", "--quiet", *args)
    assert code == 0, f"--dry-run accepted a plan the writer refused: {err}"
    want = runs.reference(capsys, base, mode)
    assert tensors_of(work / "out") == want
    assert {p.name for p in (work / "out").iterdir()} == planned | {"repair_report.json"}, "the dry run's files are not what was written"
    check_index(work / "out")
    if tp:
        code, _, err = run_captured(capsys, "fix", src, "-o", work / "tp", "--tp", "2", "--quiet", *args)
        assert code == 0, err
        code, _, err = run_captured(capsys, "unshard", work / "tp", "-o", work / "back")
        assert code == 0, err
        assert tensors_of(work / "back") == want
        check_index(work / "back")
    assert tree_hashes(src) == before, "the input was modified"
    shutil.rmtree(work)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@given(data=st.data())
@LAYOUTS
def test_any_layout_gives_the_single_shard_output(capsys, runs, request, fmt, data):
    fixture, modes, tp = FORMATS[fmt]
    base = request.getfixturevalue(fixture)
    layout = data.draw(layouts(len(stored(base / "model.safetensors")[0])), "layout")
    fix_any_layout(capsys, runs, base, data.draw(st.sampled_from(modes), "mode"), layout, tp)


@pytest.mark.parametrize("mode", MODELOPT_MODES)
def test_every_boundary_inside_a_changed_module(capsys, runs, broken_export, mode):
    """Tensors in name order (a state dict's), cut into two shards between every two tensors of
    post_projection (the issue's case: its input_scale in shard 1, its weight and scales in shard 2)."""
    names = [t[0] for t in stored(broken_export / "model.safetensors")[0]]
    order = sorted(range(len(names)), key=names.__getitem__)
    rank = {i: r for r, i in enumerate(order)}
    module = [r for r, i in enumerate(order) if names[i].startswith("post_projection.")]
    assert len(module) == 4 and module == list(range(module[0], module[0] + 4))
    for cut in module[1:]:
        shard_of = [0 if rank[i] < cut else 1 for i in range(len(names))]
        fix_any_layout(capsys, runs, broken_export, mode, (shard_of, order), tp=mode == "default")
