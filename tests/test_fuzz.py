"""Fuzz the safetensors header parser and the config readers: only the tool's own errors escape.

Inputs are both raw bytes and near-valid structures (real header shapes with one field
wrong), because the near-valid ones reach the deep checks. Bounded to stay fast in CI.
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

from repair.errors import RepairError
from repair.formats.modelopt_nvfp4 import read_declaration
from repair.io.checkpoint import Checkpoint, open_checkpoint, read_json
from repair.io.dtypes import ITEMSIZE
from repair.io.safetensors import parse_header, read_header
from repair.io.shard_writer import OutTensor, encode_header

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)

json_scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12)
dtypes = st.sampled_from(sorted(ITEMSIZE)) | st.text(max_size=6) | json_values
shapes = st.lists(st.integers(0, 6), max_size=3) | json_values
entries = st.fixed_dictionaries({"dtype": dtypes, "shape": shapes, "data_offsets": st.lists(st.integers(-2, 400), max_size=3) | json_values})
names = st.sampled_from(["w", "x.weight", "x.weight_scale", "x.weight_scale_2", "__metadata__", ""]) | st.text(max_size=6)


@pytest.fixture(scope="module")
def scratch():
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def only_our_errors(fn, *args):
    """Call fn; a RepairError is a fine answer, any other exception fails the test."""
    try:
        return fn(*args)
    except RepairError as err:
        assert str(err) and "\n" not in str(err), repr(err)
        return None


@st.composite
def valid_headers(draw) -> tuple[bytes, int]:
    """A real header for random tensors, and the matching file size."""
    count = draw(st.integers(0, 4))
    tensors = [OutTensor(f"t{i}", draw(st.sampled_from(sorted(ITEMSIZE))), tuple(draw(st.lists(st.integers(0, 5), max_size=2))))
               for i in range(count)]
    raw = encode_header(tensors, draw(st.none() | st.just({"format": "pt"})))
    return raw[8:], len(raw) + sum(t.nbytes for t in tensors)


@given(raw=st.binary(max_size=300), size=st.integers(0, 2000))
@FAST
def test_parse_header_raw_bytes(raw, size):
    only_our_errors(parse_header, Path("f.safetensors"), raw, size)


@given(header=st.dictionaries(names, entries | json_values, max_size=5), slack=st.integers(-50, 50))
@FAST
def test_parse_header_near_valid_json(header, slack):
    raw = json.dumps(header).encode()
    parsed = only_our_errors(parse_header, Path("f.safetensors"), raw, 8 + len(raw) + max(0, 200 + slack))
    if parsed is not None:  # accepted: then the tensors tile the data section exactly
        assert parsed.size == 8 + len(raw) + max(0, 200 + slack)


@given(case=valid_headers(), flip=st.integers(0, 10_000), byte=st.integers(0, 255), cut=st.integers(-3, 3))
@FAST
def test_read_header_mutated_real_headers(scratch, case, flip, byte, cut):
    raw, size = case
    prefix = struct.pack("<Q", len(raw))
    data = bytearray(prefix + raw + b"\0" * (size - 8 - len(raw)))
    if data:
        data[flip % len(data)] = byte
    path = scratch / "shard.safetensors"
    path.write_bytes(bytes(data[: max(0, len(data) + cut)] if cut < 0 else data + b"\0" * cut))
    only_our_errors(read_header, path)


@given(text=st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()) | st.sampled_from(
    [b"[" * 50_000, b"1" * 5_000, b'{"a": 1, "a": 2}', b"\xef\xbb\xbf{}", b"NaN", b"{}" * 2]))
@FAST
def test_read_json(scratch, text):
    path = scratch / "config.json"
    path.write_bytes(text)
    value = only_our_errors(read_json, path)
    assert value is None or isinstance(value, dict)


quant_sections = st.fixed_dictionaries({}, optional={
    "quant_algo": st.sampled_from(["NVFP4", "FP8", None]) | json_values,
    "quant_method": st.sampled_from(["modelopt", "compressed-tensors"]) | json_values,
    "ignore": st.lists(st.text(max_size=5), max_size=3) | json_values,
    "exclude_modules": st.lists(st.text(max_size=5), max_size=3) | json_values,
})


@given(config=st.none() | st.fixed_dictionaries({}, optional={"quantization_config": quant_sections | json_values}),
       hf=st.none() | st.fixed_dictionaries({}, optional={"quantization": quant_sections | json_values}))
@FAST
def test_read_declaration(config, hf):
    ckpt = Checkpoint(root=Path("ckpt"), shards=(), index_name=None, index=None, config=config, hf_quant_config=hf, other_files=())
    declaration = only_our_errors(read_declaration, ckpt)
    assert declaration is None or declaration.quant_algo in (None, "NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "FP8")  # issue 19: single algos read


shard_bytes = valid_headers().map(lambda c: struct.pack("<Q", len(c[0])) + c[0] + b"\0" * (c[1] - 8 - len(c[0]))) | st.binary(max_size=64)
files = st.dictionaries(
    st.sampled_from(["model.safetensors", "model-00002.safetensors", "config.json", "hf_quant_config.json",
                     "model.safetensors.index.json", "x.safetensors.index.json", "pytorch_model.bin", "sub/a.safetensors"]),
    shard_bytes | json_values.map(lambda v: json.dumps(v).encode())
    | st.fixed_dictionaries({"weight_map": st.dictionaries(st.sampled_from(["t0", "t1", "w"]), st.sampled_from(
        ["model.safetensors", "model-00002.safetensors", "../x.safetensors", "gone.safetensors"]) | json_values, max_size=3)},
        optional={"metadata": json_values}).map(lambda v: json.dumps(v).encode()),
    max_size=5)


@given(layout=files)
@FAST
def test_open_checkpoint_random_folders(scratch, layout):
    root = Path(tempfile.mkdtemp(dir=scratch))
    try:
        for name, content in layout.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_bytes(content)
        ckpt = only_our_errors(open_checkpoint, root)
        if ckpt is not None:
            only_our_errors(read_declaration, ckpt)
    finally:
        shutil.rmtree(root, ignore_errors=True)
