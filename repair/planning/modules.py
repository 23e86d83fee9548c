"""Per-module planning: which output tensors each recipe action produces, and from what.

`dequantize` turns a packed module into one BF16 weight; `take_original` copies (or casts) the
original model's weight by byte range; `requantize` packs the original weight afresh, sharing
one global scale across the fused group (gate/up, q/k/v) as ModelOpt's export does, and keeps
the checkpoint's input_scale (activation scales cannot be derived from weights); `drop` removes
every tensor of the module. Leftover scale tensors of a BF16 module are dropped.
"""

from __future__ import annotations

from repair.errors import BadInput
from repair.formats.base import Format
from repair.formats.nvfp4_packed import BROKEN_EXPORT
from repair.io.checkpoint import Checkpoint
from repair.formats.modules import StoredModule
from repair.planning.build import ModuleChange, TensorRef, TensorStep
from repair.planning.recipe import Recipe

FUSED_GROUPS = (("mlp.gate_proj", "mlp.up_proj"), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"))


def module_change(m: StoredModule, action: str, ckpt: Checkpoint, original: Checkpoint | None, recipe: Recipe,
                  modules: dict[str, StoredModule], fmt: Format) -> ModuleChange | None:
    """The change for one module, or None when the action leaves it exactly as stored."""
    infos = ckpt.infos()
    before = tuple(TensorRef(n, infos[n].dtype, infos[n].shape) for n in m.tensors)
    weight = f"{m.name}.weight"
    home = infos[m.tensor("weight")].path.name  # outputs go where the main weight is: one shard, once
    if action == "drop":
        return ModuleChange(m.name, "drop", before, (), (), home)
    if action == "requantize":
        outputs = _requantize_steps(m, ckpt, original, modules)
    elif action == "take_original":
        outputs = (_original_step(m, original, recipe.dtype),)
    elif m.is_quantized:  # dequantize
        fmt.check_packed(m, infos, str(ckpt.root), recipe.dtype)
        inputs = (m.tensor("weight"), m.tensor("weight_scale"), m.tensor("weight_scale_2"))
        outputs = (TensorStep(TensorRef(weight, recipe.dtype, m.logical_shape), "dequantize", inputs, module=m.name),)
    elif len(m.tensors) > 1:  # BF16 already, with leftover scales
        info = infos[m.tensor("weight")]
        return ModuleChange(m.name, "drop-leftover-scales", before, (TensorRef(info.name, info.dtype, info.shape),),
                            (TensorStep(TensorRef(info.name, info.dtype, info.shape), "copy", (info.name,)),), home)
    else:
        return None
    _check_no_stray(m, outputs, infos)
    return ModuleChange(m.name, action, before, tuple(s.out for s in outputs), outputs, home)


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
    name = f"{m.name}.weight"
    info = original.infos().get(name)
    if info is None:
        raise BadInput(f"{original.root}: {name} is missing from the original; pass the original of this exact model")
    if info.shape != m.logical_shape:
        raise BadInput(f"{original.root}: {name} has shape {list(info.shape)} but the checkpoint's is {list(m.logical_shape)}; "
                       "this is a different model, pass the right --original")
    op = "copy" if info.dtype == dtype else "cast"
    return TensorStep(TensorRef(name, dtype, info.shape), op, (name,), source="original", module=m.name)


def fused_group(module: str, modules: dict[str, StoredModule]) -> list[str]:
    """The module's fused siblings that exist (itself first), which must share one weight_scale_2."""
    for group in FUSED_GROUPS:
        for member in group:
            if module.endswith("." + member):
                base = module[: -len(member)]
                return [module] + [base + g for g in group if base + g != module and base + g in modules]
    return [module]


def _requantize_steps(m: StoredModule, ckpt: Checkpoint, original: Checkpoint, modules) -> tuple[TensorStep, ...]:
    group = fused_group(m.name, modules)
    for name in group:
        _original_step(modules[name], original, "BF16")  # validates presence and shape
    inputs = tuple(f"{n}.weight" for n in group)
    out_dim, in_dim = m.logical_shape
    if in_dim % 16:
        raise BadInput(f"{ckpt.root}: {m.name}: input dim {in_dim} is not a multiple of 16; NVFP4 cannot pack it")
    steps = [
        TensorStep(TensorRef(f"{m.name}.weight", "U8", (out_dim, in_dim // 2)), "requantize", inputs, "original", m.name, "weight"),
        TensorStep(TensorRef(f"{m.name}.weight_scale", "F8_E4M3", (out_dim, in_dim // 16)), "requantize", inputs, "original", m.name, "weight_scale"),
        TensorStep(TensorRef(f"{m.name}.weight_scale_2", "F32", ()), "requantize", inputs, "original", m.name, "weight_scale_2"),
    ]
    input_scale = m.tensor("input_scale")
    if input_scale is not None:
        info = ckpt.infos()[input_scale]
        steps.append(TensorStep(TensorRef(input_scale, info.dtype, info.shape), "copy", (input_scale,), module=m.name))
    return tuple(steps)
