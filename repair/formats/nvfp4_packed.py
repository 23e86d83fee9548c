"""The NVFP4 packed layout shared by ModelOpt and compressed-tensors: grouping and plan-time checks.

Both store a uint8 weight [out, in/2] (even element in the low nibble), float8_e4m3fn block
scales [out, in/16] and a float32 per-tensor global scale; they differ only in tensor names
(`leaves`: role -> stored leaf name) and in whether the global scale multiplies or divides.
"""

from __future__ import annotations

from typing import ClassVar

from repair.codec import scale_values
from repair.errors import BadInput
from repair.formats.base import Format
from repair.io.safetensors import TensorInfo
from repair.formats.modules import StoredModule
from repair.formats.nvfp4_health import block_scale_stats, read_f32_scalar

BLOCK = 16
FP8_BLOCK = 128  # compressed-tensors' FP8 block_structure [128, 128] (formats/ct_groups.py)
BROKEN_EXPORT = "the export is broken: re-download it, or re-export from the original model"


class PackedNvfp4(Format):
    """A format storing the NVFP4 packed layout: grouping and plan-time checks follow from its `LEAVES`."""

    LEAVES: ClassVar[dict[str, str]]  # role -> stored leaf name

    def group_modules(self, infos: dict[str, TensorInfo]) -> list[StoredModule]:
        """Group stored tensors into modules (see the module-level group_modules)."""
        return group_modules(infos, self.LEAVES)

    def check_packed(self, module: StoredModule, infos: dict[str, TensorInfo], where: str, out_dtype: str = "BF16") -> None:
        """Raise BadInput unless a packed module can be dequantized (see the module-level check_packed)."""
        check_packed(module, infos, where, self.LEAVES, self.GLOBAL_SCALE_IS_DIVISOR, out_dtype)


def group_modules(infos: dict[str, TensorInfo], leaves: dict[str, str]) -> list[StoredModule]:
    """Group stored tensors into modules; a weight is NVFP4 when it is 2-D uint8 with its scales (or named packed)."""
    by_module: dict[str, dict[str, TensorInfo]] = {}
    for name, info in infos.items():
        module, _, leaf = name.rpartition(".")  # split_name, inlined: this loop runs once per tensor (180k on DeepSeek-R1)
        found = by_module.get(module)
        if found is None:
            found = by_module[module] = {}
        found[leaf] = info
    modules = []
    sidecars = [(role, leaf) for role, leaf in leaves.items() if role != "weight"]
    for module, found in by_module.items():
        modules.extend(_bmm_experts(module, found, leaves, by_module))  # takes their tensors out of `found`
        if not found:
            continue
        weight_leaf = leaves["weight"] if leaves["weight"] in found else "weight" if "weight" in found else None
        if weight_leaf is None:
            modules.extend(_plain(info) for info in found.values())
            continue
        roles = (("weight", found[weight_leaf].name),) + tuple((role, found[leaf].name) for role, leaf in sidecars if leaf in found)
        modules.append(_weighted(module, weight_leaf, found, leaves, roles))
        if len(found) > len(roles):  # tensors of no role (a bias, ...) are modules of their own
            owned = {weight_leaf} | {leaf for _, leaf in sidecars if leaf in found}
            modules.extend(_plain(info) for leaf, info in found.items() if leaf not in owned)
    return sorted(modules, key=lambda m: m.name)


def _bmm_experts(module: str, found: dict[str, TensorInfo], leaves: dict[str, str], by_module: dict) -> list[StoredModule]:
    """ModelOpt's BMM-style 3-D experts (gpt-oss, Llama4): weight `X` uint8 [E, in/2, out] beside `X_weight_scale`
    [E, in/16, out], `X_weight_scale_2`, `X_input_scale` (quant_utils.quantizer_attr_names(X)), the weight quantized
    transposed (unified_export_hf.py `_export_quantized_weight`, maybe_transpose_expert_weight_dimensions, 0.47):
    one packed module `module.X` of logical shape [E, in, out]. Its tensors are taken out of `found`."""
    out = []
    for leaf, info in list(found.items()):
        scale = found.get(f"{leaf}_{leaves['weight_scale']}")
        if info.dtype != "U8" or len(info.shape) != 3 or scale is None or scale.dtype != "F8_E4M3":
            continue
        roles = tuple((role, found[f"{leaf}_{stored}"].name) for role, stored in leaves.items()
                      if role != "weight" and f"{leaf}_{stored}" in found)
        for _, name in roles:
            del found[name.rpartition(".")[2]]
        del found[leaf]
        name = f"{module}.{leaf}" if module else leaf
        if name in by_module:
            other = next(iter(by_module[name].values()))
            raise BadInput(f"{other.path or info.path}: {other.name} is stored beside the packed 3-D experts {info.name} "
                           f"(with {scale.name}), so both would be module {name}; {BROKEN_EXPORT}")
        experts, half_in, columns = info.shape
        out.append(StoredModule(name, "nvfp4", info.shape, (experts, half_in * 2, columns),
                                (("weight", info.name),) + roles))
    return out


def _plain(info: TensorInfo) -> StoredModule:
    return StoredModule(info.name, info.dtype.lower(), info.shape, info.shape, (("value", info.name),))


def _weighted(module: str, weight_leaf: str, found: dict[str, TensorInfo], leaves: dict[str, str],
              roles: tuple[tuple[str, str], ...]) -> StoredModule:
    weight = found[weight_leaf]
    scale = found.get(leaves["weight_scale"])
    has_sidecar = (scale is not None and scale.dtype == "F8_E4M3") or leaves["weight_scale_2"] in found
    named_packed = weight_leaf != "weight"
    if weight.dtype == "U8" and (named_packed or has_sidecar) and len(weight.shape) != 2:
        raise BadInput(f"{weight.path}: {weight.name}: packed NVFP4 weight is {len(weight.shape)}-D {list(weight.shape)}, but NVFP4 "
                       f"packs 2-D [out, in/2] weights, so it can be neither dequantized nor kept; {BROKEN_EXPORT}")
    packed = weight.dtype == "U8" and (named_packed or has_sidecar)  # a lost scale still means packed
    if not packed and _fp8_per_tensor(weight, scale):
        return StoredModule(module, "fp8", weight.shape, weight.shape, roles)
    if not packed and _fp8_block(weight, scale):
        return StoredModule(module, "fp8_block", weight.shape, weight.shape, roles)
    if not packed:
        return StoredModule(module, weight.dtype.lower(), weight.shape, weight.shape, roles)
    return StoredModule(module, "nvfp4", weight.shape, (weight.shape[0], weight.shape[1] * 2), roles)


def _fp8_per_tensor(weight: TensorInfo, scale: TensorInfo | None) -> bool:
    """ModelOpt's FP8 (per-tensor) layout: a 2-D float8_e4m3fn weight with a float32 scalar weight_scale."""
    return (weight.dtype == "F8_E4M3" and len(weight.shape) == 2 and scale is not None
            and scale.dtype == "F32" and scale.shape in ((), (1,)))


def _fp8_block(weight: TensorInfo, scale: TensorInfo | None) -> bool:
    """compressed-tensors' FP8 block layout (float-quantized, strategy block 128x128; DeepSeek's): a 2-D float8_e4m3fn
    weight with a float32 (or, DeepSeek-V4's ue8m0, float8_e8m0fnu) scale per 128x128 block, [ceil(out/128), ceil(in/128)]."""
    return (weight.dtype == "F8_E4M3" and len(weight.shape) == 2 and scale is not None and scale.dtype in ("F32", "F8_E8M0")
            and scale.shape == tuple(-(-d // FP8_BLOCK) for d in weight.shape))


def block_scale_shape(logical_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The fp8 block-scale shape of a packed weight: [out, in/16] for a Linear's [out, in], [E, in/16, out] for ModelOpt's
    transposed 3-D experts [E, in, out] (`_bmm_experts`)."""
    if len(logical_shape) == 3:
        experts, logical_in, out = logical_shape
        return experts, logical_in // BLOCK, out
    out, logical_in = logical_shape
    return out, logical_in // BLOCK


def check_packed(module: StoredModule, infos: dict[str, TensorInfo], where: str, leaves: dict[str, str],
                 divisor: bool = False, out_dtype: str = "BF16") -> None:
    """Raise BadInput unless a packed module can be dequantized: scales present, shaped and usable.

    Reads only the 4-byte global scale and the fp8 block scales (small), so it is cheap at plan
    time; dequantizing a NaN, infinite or non-positive scale would write garbage that looks fixed.
    """
    weight = infos[module.tensor("weight")]
    columns = module.logical_shape[1]  # the input (block) dimension in both layouts
    if columns % BLOCK:
        raise BadInput(
            f"{_at(weight, where)}: packed shape {list(weight.shape)} unpacks to {columns} input columns, "
            f"not a multiple of the {BLOCK}-element block; {BROKEN_EXPORT}"
        )
    scale = _sidecar(module, "weight_scale", infos, weight, where, leaves)
    expected = block_scale_shape(module.logical_shape)
    if scale.dtype != "F8_E4M3" or scale.shape != expected:
        raise BadInput(
            f"{_at(scale, where)}: {scale.dtype} {list(scale.shape)} does not fit packed weight {list(weight.shape)} "
            f"(expected F8_E4M3 {list(expected)}); {BROKEN_EXPORT}"
        )
    scale_2 = _sidecar(module, "weight_scale_2", infos, weight, where, leaves)
    if scale_2.dtype != "F32" or scale_2.shape not in ((), (1,)):
        raise BadInput(f"{_at(scale_2, where)}: expected a float32 scalar, found {scale_2.dtype} {list(scale_2.shape)}; {BROKEN_EXPORT}")
    global_scale = read_f32_scalar(scale_2.path, scale_2)
    invalid = scale_values.invalid(global_scale)
    if invalid:
        raise BadInput(f"{_at(scale_2, where)}: global scale {invalid.text}, so every dequantized value would be wrong; {BROKEN_EXPORT}")
    stats = block_scale_stats(scale.path, scale)
    if stats.nan or stats.negative:
        raise BadInput(f"{_at(scale, where)}: {stats.nan} NaN and {stats.negative} negative block scales; {BROKEN_EXPORT}")
    problem = scale_values.nvfp4_problem(stats.raw, global_scale, divisor, out_dtype)  # the writer asks the same
    if problem:
        raise BadInput(f"{_at(scale_2, where)}: {problem.text}; {BROKEN_EXPORT}")


def _sidecar(module: StoredModule, role: str, infos: dict[str, TensorInfo], weight: TensorInfo, where: str, leaves: dict[str, str]) -> TensorInfo:
    name = module.tensor(role)
    if name is None:
        raise BadInput(f"{_at(weight, where)}: packed NVFP4 weight without its {leaves[role]}; {BROKEN_EXPORT}")
    return infos[name]


def _at(info: TensorInfo, where: str) -> str:
    """`file: tensor` for error lines (the shard when known, else the checkpoint folder)."""
    return f"{info.path or where}: {info.name}"


def name_list(value: object, path: object, key: str) -> tuple[str, ...]:
    """A config's list of module names or patterns, or BadInput."""
    if value is None:
        return ()
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise BadInput(f"{path}: {key} must be a list of module names; fix the config")
    return tuple(value)


def append_missing(existing: list[str], names: list[str], covers) -> list[str]:
    """`existing` plus the names it does not already cover, in order; a name listed already is never listed twice
    (one target's rule may not count it, e.g. TensorRT-LLM 1.0 reading a shard's entry only through the fused name)."""
    return list(existing) + [n for n in dict.fromkeys(names) if n not in existing and not covers(existing, n)]
