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
    precision: str  # "nvfp4" (packed weight with block scales), "fp8" (float8 weight with a float32 scale), "fp8_block"
    # (float8 weight with a float32 scale per 128x128 block), else the dtype in lower case
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
    def weight_name(self) -> str:
        """The full-precision weight's tensor name: `X.weight`, or the module's own name for 3-D experts stored with no
        leaf (transformers' `mlp.experts.gate_up_proj`, which ModelOpt's packed layout keeps: formats/nvfp4_packed.py)."""
        return self.name if self.tensor("weight") == self.name else f"{self.name}.weight"

    @property
    def is_quantized(self) -> bool:
        return self.precision in QUANTIZED_PRECISIONS

    @property
    def algorithm(self) -> str | None:
        """The ModelOpt algorithm the stored tensors show (None when not quantized).

        Read from the tensors, never the config: NVFP4 with an activation scale is "NVFP4", without
        one "W4A16_NVFP4", with a per-input-channel `pre_quant_scale` "NVFP4_AWQ"; a float8 weight
        with a per-tensor float32 scale is "FP8". Doctor compares this with the declared algorithm."""
        if self.precision == "fp8":
            return "FP8"
        if self.precision == "fp8_block":
            return "FP8_BLOCK"
        if self.precision != "nvfp4":
            return None
        if self.tensor("pre_quant_scale") is not None:
            return "NVFP4_AWQ"
        return "NVFP4" if self.tensor("input_scale") is not None else "W4A16_NVFP4"

    @property
    def params(self) -> int:
        count = 1
        for dim in self.logical_shape:
            count *= dim
        return count


QUANTIZED_PRECISIONS = frozenset({"nvfp4", "fp8", "fp8_block"})
FULL_PRECISIONS = ("bf16", "f16", "f32")  # stored dtypes a weight is read as values from, with no scale


def split_name(tensor: str) -> tuple[str, str]:
    """`model.layers.0.mlp.down_proj.weight` -> (`model.layers.0.mlp.down_proj`, `weight`)."""
    module, _, leaf = tensor.rpartition(".")
    return module, leaf


def stored_bits(modules: list[StoredModule], infos: dict[str, TensorInfo]) -> float:
    """Bits stored per logical parameter over all modules (scales included)."""
    params = sum(m.params for m in modules)
    stored = sum(infos[name].nbytes for m in modules for name in m.tensors)
    return 8.0 * stored / params if params else 0.0
