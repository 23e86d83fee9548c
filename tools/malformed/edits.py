"""The starting point and the tools to break it: the tiny fixable assistant, its file names, and byte-level
edits of a safetensors header, of its tensors and of a JSON file, shared by every case module.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Callable

SHARDS = [["pre_projection"], ["post_projection"]]  # -> model-00001..3-of-00003, pre in 2, post in 3
ONE = "model.safetensors"
SHARD_1, SHARD_2, SHARD_3 = (f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3))
INDEX = "model.safetensors.index.json"


def assistant(work: Path, sharded: bool = False, broken: bool = True) -> Path:
    """The healthy starting point: the tiny broken (fixable) assistant in <work>/src."""
    from repair.demo.examples import TINY, write_assistant

    return write_assistant(work / "src", TINY, broken=broken, shards=SHARDS if sharded else None)


def _split(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path: Path, header_json: bytes, data: bytes) -> None:
    header_json += b" " * (-len(header_json) % 8)
    path.write_bytes(struct.pack("<Q", len(header_json)) + header_json + data)


def _edit_header(path: Path, edit: Callable[[dict], None]) -> None:
    header, data = _split(path)
    edit(header)
    _write(path, json.dumps(header).encode(), data)


def edit_tensors(path: Path, edit: Callable[[dict], None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content, indent=2))


def _header_len(path: Path) -> int:
    with open(path, "rb") as fh:
        return struct.unpack("<Q", fh.read(8))[0]


def _cut(path: Path, size: int) -> None:
    path.write_bytes(path.read_bytes()[:size])
