"""Logical modules: the tensors that together make one layer's parameter, and what they store.

`pre_projection` packed in NVFP4 is one module made of `weight` (uint8), `weight_scale`,
`weight_scale_2` and maybe `input_scale`. What a module *is* is decided from the tensors, never
from the config alone: the config is a claim the tensors may contradict.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from repair.io.safetensors import TensorInfo


@dataclass(frozen=True)
class StoredModule:
    """One module as stored: its precision, weight shapes and the tensors that belong to it."""

    name: str
    precision: str  # "nvfp4" for a packed weight with block scales, else the weight's dtype in lower case
    stored_shape: tuple[int, ...]
    logical_shape: tuple[int, ...]  # the full-precision weight shape the packed bytes stand for
    roles: tuple[tuple[str, str], ...]  # (role, tensor name): "weight", "weight_scale", "weight_scale_2", ...

    def tensor(self, role: str) -> str | None:
        for r, name in self.roles:  # at most four roles: a scan beats building a dict per call
            if r == role:
                return name
        return None

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(name for _, name in self.roles)

    @property
    def is_quantized(self) -> bool:
        return self.precision in QUANTIZED_PRECISIONS

    @property
    def params(self) -> int:
        count = 1
        for dim in self.logical_shape:
            count *= dim
        return count


QUANTIZED_PRECISIONS = frozenset({"nvfp4"})


def split_name(tensor: str) -> tuple[str, str]:
    """`model.layers.0.mlp.down_proj.weight` -> (`model.layers.0.mlp.down_proj`, `weight`)."""
    module, _, leaf = tensor.rpartition(".")
    return module, leaf


def stored_bits(modules: list[StoredModule], infos: dict[str, TensorInfo]) -> float:
    """Bits stored per logical parameter over all modules (scales included)."""
    params = sum(m.params for m in modules)
    stored = sum(infos[name].nbytes for m in modules for name in m.tensors)
    return 8.0 * stored / params if params else 0.0
