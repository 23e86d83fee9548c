"""The Dequantize step of one quantized module, by the algorithm its tensors show, checked at plan time.

NVFP4 and W4A16_NVFP4 read the packed weight and its two scales (the format's own checks apply);
NVFP4_AWQ also reads its per-input-channel `pre_quant_scale`, folded into the full-precision weight
(codec/awq.py) and then dropped with the module's other quantization leaves; FP8 per-tensor reads
the float8 weight and its float32 scale (codec/fp8_table.py). Every check here reads headers, a
4-byte scale or the pre_quant_scale vector only, so a plan `--dry-run` accepts is one the writer can write.
"""

from __future__ import annotations

import struct

from repair.errors import BadInput
from repair.formats.base import Format
from repair.formats.modules import StoredModule
from repair.formats.nvfp4_health import DTYPE_MAX, FP8_MAX, e4m3_value, global_scale_problem, read_f32_scalar
from repair.formats.nvfp4_packed import BROKEN_EXPORT
from repair.io.ranges import read_bytes
from repair.io.safetensors import TensorInfo
from repair.planning.model import DEQUANTIZE_INPUTS, Dequantize, TensorRef

PRE_QUANT_SCALE_DTYPES = ("F32", "BF16", "F16")


def dequantize_step(m: StoredModule, infos: dict[str, TensorInfo], fmt: Format, where: str, dtype: str) -> Dequantize:
    """The step that makes `m`'s weight `dtype`, by its stored algorithm; BadInput when its tensors cannot."""
    algorithm = m.algorithm
    if algorithm not in DEQUANTIZE_INPUTS:  # a quantized precision without a codec: ours to add, not the user's fault
        raise BadInput(f"{where}: {m.name}: dequantizing {algorithm or m.precision} is not supported; leave the module out")
    if algorithm == "FP8":
        _check_fp8_scale(m, infos, where, dtype)
    else:
        fmt.check_packed(m, infos, where, dtype)
    if algorithm == "NVFP4_AWQ":
        _check_pre_quant_scale(m, infos, where)
    inputs = tuple(m.tensor(role) for role in DEQUANTIZE_INPUTS[algorithm])
    return Dequantize(TensorRef(f"{m.name}.weight", dtype, m.logical_shape), inputs, module=m.name, algorithm=algorithm)


def _at(info: TensorInfo, where: str) -> str:
    return f"{info.path or where}: {info.name}"


def _check_fp8_scale(m: StoredModule, infos: dict[str, TensorInfo], where: str, dtype: str) -> None:
    """The per-tensor scale multiplies every value: NaN, infinite or non-positive writes garbage that looks fixed, and
    one so large that the weight's largest code times it passes `dtype`'s range writes infinities (the weight's
    bytes are read only when even FP8's largest value would overflow)."""
    info = infos[m.tensor("weight_scale")]
    value = read_f32_scalar(info.path, info)
    problem = global_scale_problem(value)
    if problem:
        raise BadInput(f"{_at(info, where)}: FP8 weight scale {problem}, so every dequantized value would be wrong; {BROKEN_EXPORT}")
    if FP8_MAX * value <= DTYPE_MAX[dtype]:
        return
    weight = infos[m.tensor("weight")]
    codes = set(read_bytes(weight.path, weight))
    peak = max((e4m3_value(c & 0x7F) for c in codes if c & 0x7F != 0x7F), default=0.0) * value
    if peak > DTYPE_MAX[dtype]:
        raise BadInput(f"{_at(info, where)}: FP8 weight scale {value:.3g} makes dequantized values reach {peak:.3g}, past {dtype}'s "
                       f"largest finite value {DTYPE_MAX[dtype]:.3g}; {BROKEN_EXPORT}")


def _check_pre_quant_scale(m: StoredModule, infos: dict[str, TensorInfo], where: str) -> None:
    """One float scale per input column of the logical weight."""
    info = infos[m.tensor("pre_quant_scale")]
    columns = m.logical_shape[1]
    if info.dtype not in PRE_QUANT_SCALE_DTYPES or info.shape != (columns,):
        raise BadInput(f"{_at(info, where)}: {info.dtype} {list(info.shape)} is not a pre_quant_scale for {m.name} "
                       f"(expected one F32/BF16/F16 value per input column: [{columns}]); {BROKEN_EXPORT}")
    # ModelOpt's AWQ scales are clamped to [1e-4, 1e4] and normalised by a positive factor. NaN / inf are left to
    # the writer's guard on the folded values (it names the dequantized weight), zero and negative fold silently
    bad = next(((i, v) for i, v in enumerate(_floats(read_bytes(info.path, info), info.dtype)) if v <= 0), None)
    if bad is not None:
        raise BadInput(f"{_at(info, where)}: column {bad[0]} is {bad[1]} (every pre_quant_scale must be positive; folding it "
                       f"would erase or negate that input channel); {BROKEN_EXPORT}")


def _floats(raw: bytes | bytearray, dtype: str) -> list[float]:
    """The values of a stored F32 / F16 / BF16 vector (BF16 is the top half of an F32)."""
    if dtype == "BF16":
        raw = b"".join(b"\0\0" + bytes(raw[i:i + 2]) for i in range(0, len(raw), 2))
    return list(struct.unpack(f"<{len(raw) // (2 if dtype == 'F16' else 4)}{'e' if dtype == 'F16' else 'f'}", raw))
