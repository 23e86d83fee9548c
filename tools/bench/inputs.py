"""Benchmark inputs, built with the project's fixture generator (repair.demo.examples.write_assistant).

Bigger inputs add filler: 512 MiB BF16 tensors that `fix` copies untouched, either as extra shards
(copied whole) or inside the changed shard (copied tensor by tensor). What is repaired is always
the real 31B assistant's pre/post_projection.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

FILLER_ELEMENTS = 1 << 28  # BF16 elements in one 512 MiB filler tensor


def build_31b(folder: Path, vocab: int | None = None) -> Path:
    from repair.demo.examples import GEMMA4_31B, write_assistant

    dims = GEMMA4_31B if vocab is None else dataclasses.replace(GEMMA4_31B, vocab=vocab)
    return write_assistant(folder, dims)


def build_compute_heavy(folder: Path, layers: int = 4) -> Path:
    """An assistant of 2048-wide layers and a 1024-token vocabulary: 5 NVFP4 linears of 4-16 M weights per layer
    (4 layers: 0.15 GB) and almost nothing to copy, so `--target bf16` is dequantizing (4 layers: 0.45 GB of bf16 out)."""
    from repair.demo.examples import AssistantDims, write_assistant

    dims = AssistantDims(hidden=2048, backbone=2048, intermediate=8192, layers=layers, heads=16, head_dim=128, global_head_dim=256, vocab=1024)
    return write_assistant(folder, dims)


def _filler(i: int, elements: int = FILLER_ELEMENTS):
    import torch

    return torch.full((elements,), (i % 7 + 1) / 8, dtype=torch.bfloat16)


def _fillers_for(src: Path, gigabytes: float) -> int:
    return max(0, math.ceil((gigabytes * 1e9 - size_bytes(src)) / (FILLER_ELEMENTS * 2)))  # at least `gigabytes`


def build_multishard(folder: Path, gigabytes: float, vocab: int | None = None) -> Path:
    """The 31B assistant as shard 1 (it holds every changed tensor) plus 512 MiB filler shards."""
    from safetensors.torch import save_file

    src = build_31b(folder, vocab)
    first = "model-00001.safetensors"
    (src / "model.safetensors").rename(src / first)
    weight_map = {name: first for name in tensor_names(src / first)}
    for i in range(_fillers_for(src, gigabytes)):
        name = f"model-{i + 2:05d}.safetensors"
        save_file({f"filler.{i}.weight": _filler(i)}, src / name, metadata={"format": "pt"})
        weight_map[f"filler.{i}.weight"] = name
    total = sum(_data_bytes(src / f) for f in set(weight_map.values()))
    (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    return src


def build_one_shard(folder: Path, gigabytes: float) -> Path:
    """The 31B assistant in one file, grown with 512 MiB filler tensors inside that same (rewritten) file.

    Streamed with the project's ShardWriter, so building holds one filler tensor, not the file.
    """
    from repair.io.safetensors import read_header
    from repair.io.shard_writer import OutTensor, ShardWriter
    from repair.io.tensors import to_bytes

    src = build_31b(folder)
    count = _fillers_for(src, gigabytes)
    if count:
        original = src / "model.safetensors"
        header = read_header(original)
        grown = src / "model.safetensors.tmp"
        fillers = [OutTensor(f"filler.{i}.weight", "BF16", (FILLER_ELEMENTS,)) for i in range(count)]
        with ShardWriter(grown, [OutTensor(t.name, t.dtype, t.shape) for t in header.tensors] + fillers, header.metadata) as writer:
            for t in header.tensors:
                writer.copy(t.name, original, t)
            for i, f in enumerate(fillers):
                writer.write(f.name, to_bytes(_filler(i)))
        grown.replace(original)
    return src


def build_64_shards(folder: Path) -> Path:
    """A tiny assistant spread over 64 shards (one per module, then splits), for header-only commands."""
    from repair.demo.examples import AssistantDims, write_assistant

    dims = AssistantDims(hidden=64, backbone=96, intermediate=128, layers=9, heads=2, head_dim=32, global_head_dim=64, vocab=128)
    probe = write_assistant(folder.with_name(folder.name + "-probe"), dims)
    modules = sorted({n.rsplit(".", 1)[0] if n.rsplit(".", 1)[-1] in ("weight", "weight_scale", "weight_scale_2", "input_scale") else n
                      for n in tensor_names(probe / "model.safetensors")})
    _rmtree(probe)
    prefixes = [[m + "." if not m.endswith("layer_scalar") else m] for m in modules[1:64]]  # the first module stays in shard 1
    src = write_assistant(folder, dims, shards=prefixes)
    shards = len(list(src.glob("*.safetensors")))
    if shards != 64:
        raise AssertionError(f"wanted 64 shards, got {shards}")
    return src


def tensor_names(path: Path) -> list[str]:
    with open(path, "rb") as fh:
        header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
    header.pop("__metadata__", None)
    return list(header)


def _data_bytes(path: Path) -> int:
    with open(path, "rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
    return path.stat().st_size - 8 - n


def size_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
