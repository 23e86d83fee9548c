"""The Dequantize step of one quantized module, by the algorithm its tensors show, checked at plan time.

NVFP4 and W4A16_NVFP4 read the packed weight and its two scales (the format's own checks apply);
NVFP4_AWQ also reads its per-input-channel `pre_quant_scale`, folded into the full-precision weight
(codec/awq.py) and then dropped with the module's other quantization leaves; FP8 per-tensor reads
the float8 weight and its float32 scale (codec/fp8_table.py); FP8 block reads it with its scale per 128x128 block (codec/fp8_block.py). Every check here reads headers, a
4-byte scale or the pre_quant_scale vector only, so a plan `--dry-run` accepts is one the writer can write.
"""

from __future__ import annotations

import struct

import numpy as np

from repair.codec import fp8_block, scale_values
from repair.errors import BadInput
from repair.formats.base import Format
from repair.formats.modules import StoredModule
from repair.formats.nvfp4_health import read_f32_scalar
from repair.formats.nvfp4_packed import BROKEN_EXPORT
from repair.io.ranges import read_bytes
from repair.io.safetensors import TensorInfo
from repair.planning.model import DEQUANTIZE_INPUTS, Dequantize, TensorRef

PRE_QUANT_SCALE_DTYPES = ("F32", "BF16", "F16")


def dequantize_step(m: StoredModule, infos: dict[str, TensorInfo], fmt: Format, where: str, dtype: str) -> Dequantize:
    """The step that makes `m`'s weight `dtype`, by its stored algorithm; BadInput when its tensors cannot."""
    algorithm = m.algorithm
    if algorithm not in DEQUANTIZE_INPUTS:  # a quantized precision without a codec: ours to add, not the user's fault
        raise BadInput(f"{where}: {m.name}: dequantizing {algorithm or m.precision} is not supported; leave the module out of "
                       "the recipe; under --target, declare it in the config as it is stored (doctor says how) or pick "
                       "a target other than bf16")
    if len(m.logical_shape) == 3 and algorithm not in ("NVFP4", "W4A16_NVFP4"):  # codec/nvfp4.py reads 3-D experts only
        raise BadInput(f"{where}: {m.name}: dequantizing {algorithm} 3-D experts is not supported; re-export them NVFP4, or "
                       "pick a target that keeps them as stored")
    if algorithm == "FP8":
        _check_fp8_scale(m, infos, where, dtype)
    elif algorithm == "FP8_BLOCK":
        _check_fp8_block_scales(m, infos, where, dtype)
    else:
        fmt.check_packed(m, infos, where, dtype)
    if algorithm == "NVFP4_AWQ":
        _check_pre_quant_scale(m, infos, where, dtype, fmt.GLOBAL_SCALE_IS_DIVISOR)
    inputs = tuple(m.tensor(role) for role in DEQUANTIZE_INPUTS[algorithm])
    return Dequantize(TensorRef(m.weight_name, dtype, m.logical_shape), inputs, module=m.name, algorithm=algorithm)


def _at(info: TensorInfo, where: str) -> str:
    return f"{info.path or where}: {info.name}"


def _check_fp8_scale(m: StoredModule, infos: dict[str, TensorInfo], where: str, dtype: str) -> None:
    """The per-tensor scale, rounded to `dtype` as the dequantizer rounds it, multiplies every value: NaN, infinite,
    not positive, rounding to 0, or carrying the weight's largest code past `dtype`'s range writes garbage that looks
    fixed (the weight's bytes are read only when a code could overflow). The writer asks the same function."""
    info, weight = infos[m.tensor("weight_scale")], infos[m.tensor("weight")]
    problem = scale_values.fp8_problem(read_f32_scalar(info.path, info), dtype, lambda: set(read_bytes(weight.path, weight)))
    if problem:
        raise BadInput(fp8_scale_error(_at(info, where), problem))


def _check_fp8_block_scales(m: StoredModule, infos: dict[str, TensorInfo], where: str, dtype: str) -> None:
    """Every 128x128 block's scale (1/16384 of the weight's bytes) positive, finite and within `dtype` times the
    largest code; the writer asks the same function (codec/fp8_block.py)."""
    info = infos[m.tensor("weight_scale")]
    problem = fp8_block.scale_problem(fp8_block.scales(block_scale_array(read_bytes(info.path, info), info), info.dtype), dtype)
    if problem:
        raise BadInput(f"{_at(info, where)}: {problem}; {BROKEN_EXPORT}")


def block_scale_array(raw: bytes | bytearray, info: TensorInfo) -> np.ndarray:
    """A stored FP8 block-scale tensor (float32, or e8m0 bytes) as a 2-D numpy array of its stored values."""
    return np.frombuffer(raw, dtype=np.uint8 if info.dtype == "F8_E8M0" else np.dtype("<f4")).reshape(info.shape)


def fp8_scale_error(at: str, problem: scale_values.ScaleProblem) -> str:
    """The one line for an unusable FP8 weight scale (plan time and the writer)."""
    wrong = ", so every dequantized value would be wrong" if problem.kind == "invalid" else ""
    return f"{at}: FP8 weight scale {problem.text}{wrong}; {BROKEN_EXPORT}"


def _check_pre_quant_scale(m: StoredModule, infos: dict[str, TensorInfo], where: str, dtype: str, divisor: bool) -> None:
    """One positive finite float scale per input column of the logical weight, whose product with the layer's largest
    dequantized weight rounds to neither 0 nor infinity in `dtype` (ModelOpt clamps its AWQ scales to [1e-4, 1e4])."""
    info = infos[m.tensor("pre_quant_scale")]
    columns = m.logical_shape[1]
    if info.dtype not in PRE_QUANT_SCALE_DTYPES or info.shape != (columns,):
        raise BadInput(f"{_at(info, where)}: {info.dtype} {list(info.shape)} is not a pre_quant_scale for {m.name} "
                       f"(expected one F32/BF16/F16 value per input column: [{columns}]); {BROKEN_EXPORT}")
    blocks, scale_2 = infos[m.tensor("weight_scale")], infos[m.tensor("weight_scale_2")]
    peak = scale_values.nvfp4_peak(read_bytes(blocks.path, blocks), read_f32_scalar(scale_2.path, scale_2), divisor, dtype)
    problem = scale_values.pre_quant_scale_problem(np.array(_floats(read_bytes(info.path, info), info.dtype)), peak, dtype)
    if problem:
        raise BadInput(f"{_at(info, where)}: {problem.text}; {BROKEN_EXPORT}")


def _floats(raw: bytes | bytearray, dtype: str) -> list[float]:
    """The values of a stored F32 / F16 / BF16 vector (BF16 is the top half of an F32)."""
    if dtype == "BF16":
        raw = b"".join(b"\0\0" + bytes(raw[i:i + 2]) for i in range(0, len(raw), 2))
    return list(struct.unpack(f"<{len(raw) // (2 if dtype == 'F16' else 4)}{'e' if dtype == 'F16' else 'f'}", raw))
