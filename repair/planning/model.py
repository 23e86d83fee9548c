"""The plan's vocabulary: frozen values that planning builds, the plan check checks and the executor writes.

A tensor step is one small type per operation, so the executor dispatches on the type (adding an
operation is one type here and one compute function in repair/execute/compute.py). Shard steps and
module changes name their kind with a StrEnum: equal to its string and written as it in JSON.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from repair.doctor.findings import Diagnosis
from repair.formats.base import Format
from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
from repair.io.checkpoint import Checkpoint
from repair.planning.recipe import Recipe


@dataclass(frozen=True)
class TensorRef:
    name: str
    dtype: str
    shape: tuple[int, ...]

    def as_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class _Step:
    """How one output tensor is produced: from `inputs`, stored in the checkpoint or (source="original") the original."""

    op: ClassVar[str]  # the operation's name, as messages show it
    out: TensorRef
    inputs: tuple[str, ...]
    source: str = "checkpoint"
    module: str | None = None


@dataclass(frozen=True)
class Copy(_Step):
    """The stored bytes of `inputs[0]`, unchanged."""

    op: ClassVar[str] = "copy"


@dataclass(frozen=True)
class Cast(_Step):
    """`inputs[0]` (an original model's tensor) converted to the output's dtype."""

    op: ClassVar[str] = "cast"


@dataclass(frozen=True)
class Dequantize(_Step):
    """A quantized weight made full precision, by the algorithm its tensors show (StoredModule.algorithm);
    inputs are that algorithm's DEQUANTIZE_INPUTS, in order."""

    op: ClassVar[str] = "dequantize"
    algorithm: str = field(default="NVFP4", kw_only=True)


@dataclass(frozen=True)
class Requantize(_Step):
    """One tensor of an original weight quantized afresh (NVFP4: weight, weight_scale, weight_scale_2; FP8
    per-tensor: weight, weight_scale); inputs: the original weights of the module's fused group, its own
    first (they share one global scale); `role` says which tensor this is."""

    op: ClassVar[str] = "requantize"
    role: str = field(kw_only=True)  # weight | weight_scale | weight_scale_2
    algorithm: str = field(default="NVFP4", kw_only=True)  # NVFP4 or FP8


# The roles a Dequantize reads, per stored algorithm: NVFP4_AWQ folds pre_quant_scale in, FP8 is per-tensor
_NVFP4_INPUTS = ("weight", "weight_scale", "weight_scale_2")
DEQUANTIZE_INPUTS = {"NVFP4": _NVFP4_INPUTS, "W4A16_NVFP4": _NVFP4_INPUTS, "NVFP4_AWQ": _NVFP4_INPUTS + ("pre_quant_scale",),
                     "FP8": ("weight", "weight_scale"), "FP8_BLOCK": ("weight", "weight_scale")}

TensorStep = Copy | Cast | Dequantize | Requantize
Computed = Cast | Dequantize | Requantize  # the steps whose bytes are computed, not copied


class ShardOp(StrEnum):
    COPY_FILE = "copy_file"  # nothing in the shard changes: the file is copied whole
    REWRITE = "rewrite"  # written tensor by tensor


@dataclass(frozen=True)
class ShardStep:
    """One output shard: copied whole when nothing in it changes, else rewritten tensor by tensor."""

    name: str
    op: ShardOp
    tensors: tuple[TensorStep, ...]
    metadata: dict | None = field(default=None, compare=False)


class ChangeAction(StrEnum):
    """What happens to a module: a recipe's action, or dropping the leftover scales of a module already BF16."""

    DEQUANTIZE = "dequantize"
    TAKE_ORIGINAL = "take_original"
    REQUANTIZE = "requantize"
    DROP = "drop"
    DROP_LEFTOVER_SCALES = "drop-leftover-scales"
    DROP_KV_CACHE_SCALE = "drop-kv-cache-scale"  # a k_scale / v_scale, when the quantization config (and its KV cache) goes


@dataclass(frozen=True)
class ModuleChange:
    """What happens to one module. Its outputs are written once, in `home`: the shard that stores its
    main weight (a module's tensors may sit in several shards, since exports shard by size)."""

    module: str
    action: ChangeAction
    before: tuple[TensorRef, ...]
    after: tuple[TensorRef, ...]
    outputs: tuple[TensorStep, ...] = field(default=(), compare=False)
    home: str = ""

    @property
    def algorithm(self) -> str | None:
        """The algorithm a dequantize reads or a requantize writes (NVFP4, W4A16_NVFP4, NVFP4_AWQ, FP8), else None."""
        return next((s.algorithm for s in self.outputs if isinstance(s, (Dequantize, Requantize))), None)

    def as_dict(self) -> dict:
        """The change as the plan's JSON and the report write it."""
        out = {"module": self.module, "action": self.action, "before": [t.as_dict() for t in self.before],
               "after": [t.as_dict() for t in self.after]}
        return out | ({"algorithm": self.algorithm} if self.algorithm else {})


@dataclass(frozen=True, eq=False)
class Plan:
    source: Checkpoint
    recipe: Recipe
    shards: tuple[ShardStep, ...]
    changes: tuple[ModuleChange, ...]
    exclusions_added: tuple[str, ...]
    json_files: dict[str, dict]  # rewritten small files: name -> new content
    copied_files: tuple[str, ...]
    removed_files: tuple[str, ...] = ()
    original: Checkpoint | None = None
    format: Format = MODELOPT_NVFP4  # the source's format (a registered formats.Format)
    unlisted: tuple[str, ...] = ()  # layers taken out of a per-layer map (MIXED_PRECISION quantized_layers)
    exclusions_removed: tuple[str, ...] = ()  # entries that matched no module, taken out under --target
    before: tuple[Diagnosis, ...] = field(default=(), compare=False)  # doctor on the source, per --target (tp 1)

    @property
    def is_noop(self) -> bool:
        return not self.changes and not self.json_files and not self.removed_files
