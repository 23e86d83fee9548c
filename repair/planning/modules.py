"""Per-module planning: which output tensors each recipe action produces, and from what.

`dequantize` turns a packed module into one BF16 weight; `take_original` copies (or casts) the
original model's weight by byte range; `requantize` packs the original weight afresh, sharing
one global scale with the modules ModelOpt's export fuses with it (formats/shared_scale.py), and keeps
the checkpoint's input_scale (activation scales cannot be derived from weights); `drop` removes
every tensor of the module. Leftover scale tensors of a BF16 module are dropped.
"""

from __future__ import annotations

from repair.errors import BadInput, UsageError
from repair.formats.base import Format
from repair.formats.nvfp4_packed import BROKEN_EXPORT
from repair.formats.shared_scale import shared_scale_siblings
from repair.io.checkpoint import Checkpoint
from repair.formats.modules import StoredModule
from repair.planning.dequantize import dequantize_step
from repair.planning.model import Cast, ChangeAction, Copy, ModuleChange, Requantize, TensorRef, TensorStep
from repair.planning.recipe import Action, Recipe



def module_change(m: StoredModule, action: Action, ckpt: Checkpoint, original: Checkpoint | None, recipe: Recipe,
                  modules: dict[str, StoredModule], fmt: Format, declared: str | None = None) -> ModuleChange | None:
    """The change for one module, or None when the action leaves it exactly as stored (`declared`: the
    checkpoint's single quant_algo, None when per-layer or absent)."""
    infos = ckpt.infos()
    before = tuple(TensorRef(n, infos[n].dtype, infos[n].shape) for n in m.tensors)
    home = infos[m.tensor("weight") or m.tensors[0]].path.name  # outputs go where the main weight is: one shard, once
    if action == Action.DROP:
        return ModuleChange(m.name, ChangeAction.DROP, before, (), (), home)
    if action == Action.REQUANTIZE:
        outputs = _requantize_steps(m, ckpt, original, modules, declared)
    elif action == Action.TAKE_ORIGINAL:
        outputs = (_original_step(m, original, recipe.dtype),)
    elif m.is_quantized:  # dequantize, by the algorithm the module's tensors show
        outputs = (dequantize_step(m, infos, fmt, str(ckpt.root), recipe.dtype),)
    elif len(m.tensors) > 1:  # BF16 already, with leftover scales
        info = infos[m.tensor("weight")]
        kept = TensorRef(info.name, info.dtype, info.shape)
        return ModuleChange(m.name, ChangeAction.DROP_LEFTOVER_SCALES, before, (kept,), (Copy(kept, (info.name,)),), home)
    else:
        return None
    _check_no_stray(m, outputs, infos)
    return ModuleChange(m.name, ChangeAction(action), before, tuple(s.out for s in outputs), outputs, home)


def _check_no_stray(m: StoredModule, outputs: tuple[TensorStep, ...], infos: dict) -> None:
    """An output may replace the module's own tensors, never another stored tensor: compressed-tensors
    stores `weight_packed`, so a stray `weight` beside it would be written twice (the input's defect)."""
    for step in outputs:
        name = step.out.name
        if name in infos and name not in m.tensors:
            raise BadInput(f"{infos[name].path}: {name} is stored beside {m.tensor('weight')}, and changing {m.name} writes a "
                           f"{name} of its own; a module has one weight, so {BROKEN_EXPORT}")


def _original_step(m: StoredModule, original: Checkpoint, dtype: str) -> TensorStep:
    """The original's BF16 weight for this module, checked against the checkpoint's logical shape."""
    name = m.weight_name
    info = original.infos().get(name)
    if info is None:
        raise BadInput(f"{original.root}: {name} is missing from the original; pass the original of this exact model")
    if info.shape != m.logical_shape:
        raise BadInput(f"{original.root}: {name} has shape {list(info.shape)} but the checkpoint's is {list(m.logical_shape)}; "
                       "this is a different model, pass the right --original")
    step = Copy if info.dtype == dtype else Cast
    return step(TensorRef(name, dtype, info.shape), (name,), source="original", module=m.name)


def fused_group(module: str, modules: dict[str, StoredModule], algorithm: str = "NVFP4") -> list[str]:
    """The module and its stored siblings (itself first) that ModelOpt's export quantizes to `algorithm` with one
    shared global scale: a module requantized shares it with them (formats/shared_scale.py)."""
    return shared_scale_siblings(module, modules, algorithm)


def requantize_algorithm(m: StoredModule, declared: str | None, where: str) -> str:
    """What a requantized module is packed as: FP8 per-tensor when it is stored FP8 (or is BF16 in a checkpoint
    declaring FP8 throughout), else NVFP4 (W4A16_NVFP4 stays so: it has no input_scale to keep)."""
    if m.algorithm == "NVFP4_AWQ":
        raise UsageError(f"{where}: {m.name}: requantizing NVFP4_AWQ needs ModelOpt's AWQ calibration (its pre_quant_scale comes from "
                         "activations); dequantize the module or keep it")
    return _packed_as(m, declared)


def _packed_as(m: StoredModule, declared: str | None) -> str:
    return "FP8" if m.algorithm == "FP8" or (m.algorithm is None and declared == "FP8") else "NVFP4"


def requantized_group(m: StoredModule, modules: dict[str, StoredModule], declared: str | None) -> list[str]:
    """The module and the siblings requantized with it (itself first): those ModelOpt's export gives one global scale
    when packed as the module is (FP8 per-tensor siblings keep their own scale, so requantizing one leaves the others)."""
    algorithm = _packed_as(m, declared)
    return [n for n in fused_group(m.name, modules, algorithm) if _packed_as(modules[n], declared) == algorithm]


def _requantize_steps(m: StoredModule, ckpt: Checkpoint, original: Checkpoint, modules, declared: str | None) -> tuple[TensorStep, ...]:
    algorithm = requantize_algorithm(m, declared, str(ckpt.root))
    if len(m.logical_shape) != 2:
        raise BadInput(f"{ckpt.root}: {m.name}: requantizing {len(m.logical_shape)}-D experts is not supported (ModelOpt packs them "
                       "transposed per expert); dequantize or take_original them")
    group = requantized_group(m, modules, declared)  # one shared scale
    for name in group:
        _original_step(modules[name], original, "BF16")  # validates presence and shape
    inputs = tuple(f"{n}.weight" for n in group)
    out_dim, in_dim = m.logical_shape
    if algorithm == "FP8":
        layout = (("weight", "F8_E4M3", (out_dim, in_dim)), ("weight_scale", "F32", ()))
    elif in_dim % 16:
        raise BadInput(f"{ckpt.root}: {m.name}: input dim {in_dim} is not a multiple of 16; NVFP4 cannot pack it")
    else:
        layout = (("weight", "U8", (out_dim, in_dim // 2)), ("weight_scale", "F8_E4M3", (out_dim, in_dim // 16)), ("weight_scale_2", "F32", ()))
    steps: list[TensorStep] = [Requantize(TensorRef(f"{m.name}.{role}", dtype, shape), inputs, "original", m.name, role=role, algorithm=algorithm)
                               for role, dtype, shape in layout]
    input_scale = m.tensor("input_scale")
    if input_scale is not None:
        info = ckpt.infos()[input_scale]
        steps.append(Copy(TensorRef(input_scale, info.dtype, info.shape), (input_scale,), module=m.name))
    return tuple(steps)
