"""Fuzz the names and values read from data: a real tp_manifest.json with random edits (hostile names
among them) given to `unshard`, and a real index whose weight_map names shards anywhere, given to
`fix`. Only the tool's own one-line errors escape, nothing outside OUT changes (a victim folder
beside OUT is hashed), and the input is never changed. Same style and budget as tests/test_fuzz.py.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from repair.demo.examples import TINY, write_assistant
from repair.tp.unshard import unshard
from tests.conftest import run_cli
from tests.test_fuzz import FAST, json_values, only_our_errors
from tests.test_reliability_corpus import tree

VICTIM_FILE = "victim/x"
HOSTILE = ["../victim/x", "../../victim/x", "rank-0/../../victim/x", "a/../../victim/x", "", ".", "..", "a//b", "/", "C:\\x",
           "x\x00y", "..\\victim\\x", ".hidden", "rank-1", "model.safetensors", "config.json", "repair_report.json", "\ud800",
           "x" * 300]
names = st.sampled_from(HOSTILE) | st.text(max_size=8) | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1, max_size=2)


@pytest.fixture(scope="module")
def world():
    """A scratch folder holding a real `fix --tp 2` output (with an index), and an absolute path to the victim file."""
    root = Path(tempfile.mkdtemp(prefix="fuzz-names-"))
    src = write_assistant(root / "src", TINY, shards=[["pre_projection"], ["post_projection"]])
    assert run_cli("fix", src, "-o", root / "tp", "--tp", "2", "--quiet") == 0
    yield root
    shutil.rmtree(root, ignore_errors=True)


def key_paths(value, prefix=()) -> list[tuple]:
    """Every place in a JSON value, as a tuple of keys and indexes (tensor entries: the first two only)."""
    places = [prefix] if prefix else []
    if isinstance(value, dict):
        items = list(value.items())[:2] if prefix == ("tensors",) else value.items()
        for k, v in items:
            places += key_paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value[:3]):
            places += key_paths(v, prefix + (i,))
    return places


def edit(manifest: dict, place: tuple, action: str, value) -> None:
    """Apply one edit; a place an earlier edit removed or replaced by a scalar is skipped."""
    *parents, last = place
    node = manifest
    for key in parents:
        node = node[key]
    if not isinstance(node, (dict, list)):
        return
    if action == "delete":
        node.pop(last) if isinstance(node, dict) else node.pop(last)
    elif action == "rename" and isinstance(node, dict):
        node[value if isinstance(value, str) else str(value)] = node.pop(last)
    else:
        node[last] = value


@st.composite
def edits(draw, places: list[tuple], victim: str):
    count = draw(st.integers(1, 3))
    return [(draw(st.sampled_from(places)), draw(st.sampled_from(["set", "delete", "rename"])),
             draw(names | st.just(victim) | json_values)) for _ in range(count)]


def run_contained(root: Path, src: Path, run) -> None:
    """Run `run()` and check that it changed nothing outside OUT, nor the input."""
    before_victim, before_src, entries = tree(root / "victim"), tree(src), {p.name for p in root.iterdir()}
    run()
    assert_contained(root, before_victim, before_src, src, entries)


def assert_contained(root: Path, before_victim: dict, before_src: dict, src: Path, entries: set[str]) -> None:
    assert tree(root / "victim") == before_victim, "a file outside OUT changed"
    assert tree(src) == before_src, "the input changed"
    assert {p.name for p in root.iterdir()} <= entries | {"out"}, "something was written beside OUT"


def fresh_scene(world: Path, name: str) -> tuple[Path, Path]:
    root = Path(tempfile.mkdtemp(dir=world, prefix=name))
    (root / "victim").mkdir()
    (root / VICTIM_FILE).write_text("victim\n")
    return root, root / "out"


@given(data=st.data())
@FAST
def test_unshard_random_manifest_edits(world, data):
    root, out = fresh_scene(world, "unshard-")
    try:
        src = root / "tp"
        shutil.copytree(world / "tp", src)
        manifest = json.loads((src / "tp_manifest.json").read_text())
        for place, action, value in data.draw(edits(key_paths(manifest), str(root / VICTIM_FILE))):
            try:
                edit(manifest, place, action, value)
            except (KeyError, IndexError, TypeError):
                pass  # an earlier edit removed this place, or made a list of it
        (src / "tp_manifest.json").write_text(json.dumps(manifest))
        run_contained(root, src, lambda: only_our_errors(unshard, src, out))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _fix_refuses_or_writes(src: Path, out: Path) -> None:
    assert run_cli("fix", src, "-o", out, "--quiet") in (0, 2)


@given(renames=st.dictionaries(st.sampled_from(["pre_projection.weight", "post_projection.weight", "pre_projection.weight_scale"]),
                               names | json_values, min_size=1, max_size=3))
@FAST
def test_fix_index_with_hostile_shard_names(world, renames):
    root, out = fresh_scene(world, "index-")
    try:
        src = root / "ckpt"
        shutil.copytree(world / "src", src)
        index_path = next(src.glob("*.index.json"))
        index = json.loads(index_path.read_text())
        for tensor, shard in renames.items():
            index["weight_map"][tensor] = shard
        index_path.write_text(json.dumps(index))
        run_contained(root, src, lambda: _fix_refuses_or_writes(src, out))
    finally:
        shutil.rmtree(root, ignore_errors=True)
