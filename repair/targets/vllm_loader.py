"""Predict what vLLM's drafter loader does with each stored tensor, rank by rank.

vLLM walks the checkpoint's tensors in sorted order (files, then names) and hands each to its
parameter's loader. Row-parallel layers narrow the *loaded* tensor along the input dim by the
parameter's width (so a packed uint8 weight half as wide fails with torch's narrow error, or on
some ranks fits and loads garbage); column and merged layers narrow the output dim and then
assert equal shapes. An NVFP4 layer's fp8 block scales go through the same narrowing as its
weight; its per-tensor scales (weight_scale_2, input_scale) must be 0-d or [1]. A W4A16 NVFP4
layer has the same parameters (vLLM registers input_scale and drops it after loading); an FP8 layer
has a float8 weight [out, in] and per-tensor weight_scale and input_scale. Unknown names raise
(>= 0.25) or are skipped (0.21-0.24).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repair.arch import LayerKind, ModuleSpec
from repair.io.safetensors import TensorInfo
from repair.formats.modules import split_name
from repair.targets.precision import PACKED
from repair.targets.profiles import Target

MODELOPT_LEAVES = {"weight": "weight", "weight_scale": "weight_scale", "weight_scale_2": "weight_scale_2", "input_scale": "input_scale"}
NVFP4_GROUP = 16  # elements per fp8 block scale
# vLLM 0.32 modelopt.py KFp8StaticTensor: an FP8 linear's parameters (weight_scale and input_scale per tensor)
FP8_PARAMS = ("weight", "weight_scale", "input_scale")
FP8_BLOCK_PARAMS = ("weight", "weight_scale")  # CompressedTensorsW8A8Fp8, block strategy: activations quantized dynamically
STORED_DTYPE = {"nvfp4": "U8", "w4a16_nvfp4": "U8", "fp8": "F8_E4M3"}  # what each built weight holds (bf16: neither)
HF_TO_VLLM_PREFIX = {"pre_projection": "model.pre_projection", "post_projection": "model.post_projection"}


@dataclass(frozen=True)
class Outcome:
    """What happens to one stored tensor on one rank."""

    tensor: str
    rank: int
    status: str  # "ok" | "error" | "garbage" (loads silently with wrong values) | "skipped" | "unloaded" (the weight
    # is stored under a name the runtime skips, so the layer keeps uninitialised memory)
    error: str | None = None  # the runtime's exception, as `Type: message`


def vllm_name(tensor: str) -> str:
    """The parameter name vLLM's Gemma4MTP mapper gives a checkpoint tensor."""
    for hf, vllm in HF_TO_VLLM_PREFIX.items():
        if tensor.startswith(hf + "."):
            tensor = vllm + tensor[len(hf):]
    for shard in ("gate_proj", "up_proj"):
        tensor = tensor.replace(f".mlp.{shard}.", ".mlp.gate_up_proj.")
    return tensor


def narrow_error(start: int, length: int, size: int) -> str:
    return f"RuntimeError: start ({start}) + length ({length}) exceeds dimension size ({size})."


def no_param_error(tensor: str, kind: LayerKind, params: tuple[str, ...]) -> str:
    name = vllm_name(tensor)
    module = split_name(name)[0]
    listed = "{" + ", ".join(repr(f"{module}.{p}") for p in params) + "}"
    return (
        f"ValueError: There is no module or parameter named {name!r} in Gemma4MTP. "
        f"The available parameters belonging to {module} ({kind.runtime_class}) are: {listed}"
    )


def simulate(
    infos: list[TensorInfo], specs: dict[str, ModuleSpec], precision: dict[str, str], target: Target, tp: int = 1,
    leaves: dict[str, str] | None = None, *, kinds: dict[str, LayerKind],
) -> list[Outcome]:
    """Outcomes for every stored tensor (in load order) on every rank; `precision` is what the runtime builds,
    `kinds` how it builds each layer role (the architecture's loader profile).

    `leaves` maps the parameter names the runtime allocates for a packed layer to their roles
    (ModelOpt's names by default; compressed-tensors' are `weight_packed`, `weight_global_scale`, ...).
    """
    leaves = leaves or MODELOPT_LEAVES
    outcomes = []
    for info in infos:
        module, leaf = split_name(info.name)
        spec = specs.get(module) or specs.get(info.name)
        if spec is None:
            continue  # not a module the architecture defines; reported elsewhere
        kind = kinds[spec.role]
        for rank in range(tp):
            outcomes.append(_one(info, leaf, spec, kind, precision.get(spec.name, "bf16"), target, rank, tp, leaves))
    return outcomes


def _one(info: TensorInfo, leaf: str, spec: ModuleSpec, kind: LayerKind, precision: str, target: Target, rank: int, tp: int,
         leaves: dict[str, str]) -> Outcome:
    if not spec.is_linear:
        return Outcome(info.name, rank, "ok")
    params = (tuple(leaves) if precision in PACKED else FP8_PARAMS if precision == "fp8" else
              FP8_BLOCK_PARAMS if precision == "fp8_block" else ("weight",))
    if leaf not in params:
        if target.profile.unknown_tensors == "skip":
            stored_weight = leaf != "weight" and leaves.get(leaf) == "weight"  # e.g. weight_packed where `weight` is built
            return Outcome(info.name, rank, "unloaded" if stored_weight else "skipped")
        return Outcome(info.name, rank, "error", no_param_error(info.name, kind, params))
    role = leaves.get(leaf, leaf) if precision in PACKED else leaf
    if role == "weight":
        return _weight(info, spec, kind, precision, rank, tp)
    if role == "weight_scale" and precision in PACKED:
        return _block_scale(info, spec, kind, rank, tp)
    return _per_tensor_scale(info, kind, rank)


def _weight(info: TensorInfo, spec: ModuleSpec, kind: LayerKind, precision: str, rank: int, tp: int) -> Outcome:
    """Load one weight into the parameter the runtime allocated ([out, in] BF16 or float8, [out, in/2] uint8)."""
    out_dim, in_dim = spec.shape
    param = (out_dim, in_dim // 2) if precision in PACKED else (out_dim, in_dim)
    error = _narrow_error(info.shape, param, kind, rank, tp)
    if error:
        return Outcome(info.name, rank, "error", error)
    if STORED_DTYPE.get(precision) != (info.dtype if info.dtype in STORED_DTYPE.values() else None):
        return Outcome(info.name, rank, "garbage")  # fits, but the bytes mean something else in this parameter
    return Outcome(info.name, rank, "ok")


def _block_scale(info: TensorInfo, spec: ModuleSpec, kind: LayerKind, rank: int, tp: int) -> Outcome:
    """fp8 block scales [out, in/16] are narrowed and shape-checked exactly like the weight (measured)."""
    if len(info.shape) != 2:
        return Outcome(info.name, rank, "ok")  # not predicted; the NVFP4 health checks report the shape
    out_dim, in_dim = spec.shape
    error = _narrow_error(info.shape, (out_dim, in_dim // NVFP4_GROUP), kind, rank, tp)
    return Outcome(info.name, rank, "error", error) if error else Outcome(info.name, rank, "ok")


def _per_tensor_scale(info: TensorInfo, kind: LayerKind, rank: int) -> Outcome:
    """weight_scale_2 / input_scale: a 0-d or [1] tensor fits its per-tensor slot, anything else trips a bare assert."""
    if info.shape in ((), (1,)):
        return Outcome(info.name, rank, "ok")
    where = "PerTensorScaleParameter._load_into_shard_id" if kind.style == "merged" else "BasevLLMParameter._assert_and_load"
    return Outcome(info.name, rank, "error", f"AssertionError: (no message) shape check in {where} fails")


def _narrow_error(stored: tuple[int, ...], param: tuple[int, int], kind: LayerKind, rank: int, tp: int) -> str | None:
    """What vLLM's row/column/merged loaders raise narrowing `stored` into this rank's slice of `param`, if anything."""
    if kind.style == "row":
        width = param[1] // tp
        start = rank * width
        if start + width > stored[1]:
            return narrow_error(start, width, stored[1])
        narrowed = (stored[0], width)
        local = (param[0], width)
    elif kind.style in ("column", "merged"):
        height = param[0] // tp
        if rank * height + height > stored[0]:
            return narrow_error(rank * height, height, stored[0])
        narrowed = (height, stored[1])
        local = (height, param[1])
    else:
        narrowed, local = stored, param
    if narrowed != local:
        return "AssertionError: " + _assertion(kind)
    return None


def _assertion(kind: LayerKind) -> str:
    """vLLM's bare `assert` has no message; name the check that fails so users can find it."""
    loader = {"row": "load_row_parallel_weight", "column": "load_column_parallel_weight", "merged": "load_merged_column_weight"}
    return f"(no message) shape check in {loader.get(kind.style, 'weight_loader')} fails"


def shard_order(file_name: str) -> tuple:
    """vLLM's order of a checkpoint's shard files (weight_utils.py _natural_sort_key: model-2 before model-10), each
    digit run a number (a name is at most 255 bytes: no int() of a hostile length)."""
    parts = re.split(r"(\d+)", file_name[:255])
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts))
