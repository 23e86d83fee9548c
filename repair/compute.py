"""Producing changed tensors' bytes (the only place besides examples that needs torch).

A requantized module yields three tensors (packed weight, block scales, global scale) from one
computation; results are cached per module until all of its outputs are written, so memory
holds at most one module's tensors.
"""

from __future__ import annotations

from pathlib import Path

import torch

from repair.codec import nvfp4
from repair.io import tensors
from repair.io.safetensors import ShardHeader, TensorInfo, read_bytes
from repair.planning import TensorStep

Located = dict[str, tuple[ShardHeader, TensorInfo]]


class Computer:
    """Computes TensorSteps against the checkpoint and (optionally) the original model."""

    def __init__(self, checkpoint: Located, original: Located | None = None, global_scale_is_divisor: bool = False):
        self._sources = {"checkpoint": checkpoint, "original": original or {}}
        self._divisor = global_scale_is_divisor  # compressed-tensors stores 1 / ModelOpt's weight_scale_2
        self._cache: dict[str, dict[str, torch.Tensor]] = {}

    def load(self, name: str, source: str = "checkpoint") -> torch.Tensor:
        shard, info = self._sources[source][name]
        return tensors.from_bytes(read_bytes(Path(shard.path), info), info)

    def bytes_of(self, step: TensorStep) -> memoryview:
        return tensors.to_bytes(self.tensor(step))

    def tensor(self, step: TensorStep) -> torch.Tensor:
        if step.op == "dequantize":
            packed, scale, scale_2 = (self.load(n, step.source) for n in step.inputs)
            return nvfp4.dequantize(packed, scale, scale_2, tensors.TORCH_DTYPE[step.out.dtype], divisor=self._divisor)
        if step.op == "cast":
            return self.load(step.inputs[0], step.source).to(tensors.TORCH_DTYPE[step.out.dtype])
        if step.op == "requantize":
            return self._requantized(step)[step.role]
        raise AssertionError(f"unknown tensor op {step.op}")

    def _requantized(self, step: TensorStep) -> dict[str, torch.Tensor]:
        """Quantize the original weight with the fused group's shared global scale (max over members)."""
        cached = self._cache.get(step.module)
        if cached is None:
            weights = [self.load(n, step.source) for n in step.inputs]
            scale_2 = torch.stack([nvfp4.global_scale(w) for w in weights]).amax()
            packed, scale, scale_2 = nvfp4.quantize(weights[0], scale_2)
            cached = {"weight": packed, "weight_scale": scale, "weight_scale_2": scale_2.reshape(())}
            self._cache = {step.module: cached}  # one module at a time
        return cached
