"""Producing changed tensors' bytes.

Dequantizing a ModelOpt/compressed-tensors NVFP4 weight into BF16/F16/F32 (the whole of
`--target bf16`) runs on numpy tables (`codec.dequant_table`) and never imports torch (~1-1.5 s):
2-D Linears and ModelOpt's 3-D BMM experts (expert by expert, one expert's packed bytes read at a time; `each_expert`
gives them one at a time, which execute/experts.py writes at their offsets, so memory holds one expert).
Casts and requantization use torch, imported at their first use; so does a Dequantize whose layout the
table does not take, which the plan-time check (formats/nvfp4_packed.py `check_packed`) refuses first.

FP8 per-tensor, FP8 block and NVFP4_AWQ weights dequantize on numpy too (codec/fp8_table, codec/fp8_block, codec/awq).
A requantized module yields its tensors (NVFP4: packed weight, block scales, global scale; FP8:
weight and scale) from one computation; results are cached per module until all of its outputs
are written, so memory holds at most one module's tensors.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np

from repair.codec import awq, dequant_table, float_bits, fp8_block, fp8_table, scale_values
from repair.errors import BadInput
from repair.formats.nvfp4_packed import BROKEN_EXPORT, block_scale_shape
from repair.io.ranges import read_part, read_tensor, source_of
from repair.io.safetensors import ShardHeader, TensorInfo
from repair.planning.dequantize import fp8_scale_error
from repair.planning.model import Cast, Computed, Copy, Dequantize, Requantize, TensorStep

if TYPE_CHECKING:
    import torch

Located = dict[str, tuple[ShardHeader, TensorInfo]]
NUMPY_ONLY = ("FP8", "FP8_BLOCK", "NVFP4_AWQ")  # algorithms dequantized on numpy alone (codec/fp8_table, codec/awq)


def torch_view(bits: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Output bit patterns (uint16/uint32) as a torch tensor of `dtype`, without a copy."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(bits)).view(dtype)


def requantized_module(step: TensorStep) -> str | None:
    """The module whose requantized outputs this step is one of (they are one unit of work), else None."""
    return step.module if isinstance(step, Requantize) else None


def computed_unit(unit: Sequence[TensorStep]) -> bool:
    """A unit whose bytes are computed (every step of a unit is of one kind), not copied."""
    return not isinstance(unit[0], Copy)


def _unpacked(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The logical shape of a packed NVFP4 weight: its input (block) dimension doubled, [r, 2h] or [E, 2h, c]."""
    return (shape[0], shape[1] * 2) if len(shape) == 2 else (shape[0], shape[1] * 2, shape[2])


class ExpertReader(Sequence):
    """A stored 3-D tensor [E, ...] (ModelOpt's packed experts [E, in/2, out], their block scales, an original's BF16
    experts) as E arrays, each read when asked (one pread): memory holds one expert's bytes, not the tensor's (a
    gpt-oss-120b gate_up_proj is 1 GiB packed, 4 GiB in BF16)."""

    def __init__(self, shard: ShardHeader, info: TensorInfo):
        self._shard, self._info, self._source = shard, info, source_of(shard)
        self.shape = tuple(info.shape[1:])  # one expert's
        size = info.nbytes // info.shape[0] if info.shape[0] else 0
        self.expert = TensorInfo(info.name, info.dtype, self.shape, 0, size)  # one expert as `part` gives it

    def __len__(self) -> int:
        return self._info.shape[0]

    def __getitem__(self, expert: int) -> np.ndarray:
        """Expert `expert` of a 1-byte tensor (packed bytes, block scales) as uint8 [shape[1:]] (others: `part`)."""
        return np.frombuffer(self.part(expert), dtype=np.uint8).reshape(self.shape)

    def part(self, expert: int) -> bytearray:
        """Expert `expert`'s stored bytes (negative: from the end); IndexError past either end, which ends Sequence's
        iteration (an offset outside the tensor would read its neighbours' bytes)."""
        if not -len(self) <= expert < len(self):
            raise IndexError(f"expert {expert} of {len(self)}")
        expert %= len(self)
        return read_part(self._shard, self._source, self._info, expert * self.expert.nbytes, self.expert.nbytes)


class Computer:
    """Computes the computed tensor steps against the checkpoint and (optionally) the original model."""

    def __init__(self, checkpoint: Located, original: Located | None = None, global_scale_is_divisor: bool = False):
        self._sources = {"checkpoint": checkpoint, "original": original or {}}
        self._divisor = global_scale_is_divisor  # compressed-tensors stores 1 / ModelOpt's weight_scale_2
        self._local = threading.local()  # per thread: the requantized module being written (execute/parallel.py)

    def load(self, name: str, source: str = "checkpoint") -> torch.Tensor:
        from repair.io import tensors

        shard, info = self._sources[source][name]
        return tensors.from_bytes(read_tensor(shard, info), info)

    def bytes_of(self, step: Computed) -> memoryview:
        if isinstance(step, Dequantize) and self._numpy_dequantizes(step):
            return memoryview(self._dequantized_bits(step).reshape(-1).view(np.uint8))
        from repair.io import tensors

        result = self.tensor(step)
        if isinstance(step, (Dequantize, Cast)) and result.is_floating_point():
            self._refuse_non_finite(step, int((~result.isfinite()).sum()))
        return tensors.to_bytes(result)

    def unit_bytes(self, steps: Sequence[Computed]) -> list[memoryview]:
        """The bytes of one unit of work (a tensor, or every output of one requantized module), on the calling
        thread; its cached computation is dropped after, so a thread holds at most the unit it makes."""
        try:
            return [self.bytes_of(step) for step in steps]
        finally:
            self.forget()

    def forget(self) -> None:
        """Drop this thread's cached requantized module (its unit is made)."""
        self._local.cache = {}

    def _refuse_non_finite(self, step: Dequantize | Cast, count: int, blocks: bool = False) -> None:
        """The last guard against garbage that looks fixed: plan-time checks read the scales, this reads the result
        (`blocks`: `count` is of NVFP4 blocks whose scale's row of the table gives one, not of values)."""
        if count:
            shard, info = self._sources[step.source][step.inputs[0]]
            what = (f"of the blocks of 16 {step.out.dtype} values it gives hold a NaN or an infinity" if blocks
                    else f"of the {step.out.dtype} values it gives are NaN or infinite")
            raise BadInput(f"{shard.path}: {info.name}: {count} {what} ({step.op}); nothing was written; "
                           "re-download or re-export it, or leave the module out")

    def _refuse_scale(self, step: Dequantize, index: int, problem: scale_values.ScaleProblem | None) -> None:
        """A scale the plan-time check (the same function, formats/nvfp4_packed.py, planning/dequantize.py) refuses."""
        if problem:
            shard, info = self._sources[step.source][step.inputs[index]]
            raise BadInput(f"{shard.path}: {info.name}: {problem.text}; {BROKEN_EXPORT}")

    def tensor(self, step: Computed) -> torch.Tensor:
        """The step's result, by its type: a new step type is one more case here."""
        from repair.codec import nvfp4
        from repair.io import tensors

        match step:
            case Dequantize() if self._numpy_dequantizes(step):
                return torch_view(self._dequantized_bits(step), tensors.TORCH_DTYPE[step.out.dtype])
            case Dequantize():
                packed, scale, scale_2 = (self.load(n, step.source) for n in step.inputs)
                return nvfp4.dequantize(packed, scale, scale_2, tensors.TORCH_DTYPE[step.out.dtype], divisor=self._divisor)
            case Cast():
                return self.load(step.inputs[0], step.source).to(tensors.TORCH_DTYPE[step.out.dtype])
            case Requantize():
                return self._requantized(step)[step.role]

    def _numpy_dequantizes(self, step: Dequantize) -> bool:
        """FP8 and NVFP4_AWQ always run on numpy (their plan-time checks ensure the layout); NVFP4 where the table fits."""
        return step.out.dtype in dequant_table.OUT_DTYPES and (step.algorithm in NUMPY_ONLY or self._table_dequantizes(step))

    def _table_dequantizes(self, step: Dequantize) -> bool:
        """The torch-free NVFP4 path applies: uint8 [r, h] weight with FP8 [r, 2h/16] scales, or ModelOpt's 3-D experts
        [E, h, c] with [E, 2h/16, c] (block_scale_shape), and one float32 global scale."""
        packed, scale, scale_2 = (self._sources[step.source][n][1] for n in step.inputs)
        return (
            packed.dtype == "U8" and scale.dtype == "F8_E4M3" and scale_2.dtype == "F32" and scale_2.nbytes == 4
            and len(packed.shape) in (2, 3) and tuple(scale.shape) == block_scale_shape(_unpacked(packed.shape))
        )

    def _dequantized_bits(self, step: Dequantize) -> np.ndarray:
        """The output's bit patterns by the stored algorithm; a NaN or infinite result is refused, never written."""
        if step.algorithm == "FP8":
            return self._fp8_bits(step)
        if step.algorithm == "FP8_BLOCK":
            return self._fp8_block_bits(step)
        scale = self._array(step.inputs[1], step.source, np.uint8)
        packed = self._array(step.inputs[0], step.source, np.uint8) if scale.ndim == 2 else self.experts(step.inputs[0], step.source)
        scale_2 = self._scalar(step.inputs[2], step.source)
        self._refuse_scale(step, 2, scale_values.nvfp4_problem(scale.tobytes(), scale_2, self._divisor, step.out.dtype))
        self._refuse_non_finite(step, dequant_table.non_finite_blocks(scale, scale_2, step.out.dtype, self._divisor), blocks=True)
        table = dequant_table.dequantize if scale.ndim == 2 else dequant_table.dequantize_experts  # expert by expert
        bits = table(packed, scale, scale_2, step.out.dtype, self._divisor)
        if step.algorithm == "NVFP4_AWQ":  # fold the per-input-channel scale in: the layer's function without it
            pre_quant_scale = self._floats(step.inputs[3], step.source)
            peak = scale_values.nvfp4_peak(scale.tobytes(), scale_2, self._divisor, step.out.dtype)
            self._refuse_scale(step, 3, scale_values.pre_quant_scale_problem(pre_quant_scale, peak, step.out.dtype))
            awq.fold(bits, pre_quant_scale, step.out.dtype)
            self._refuse_non_finite(step, int(np.count_nonzero(dequant_table.non_finite(bits, step.out.dtype))))
        return bits

    def by_expert(self, step: Computed) -> bool:
        """A 3-D NVFP4 weight the table dequantizes, which `each_expert` gives one expert at a time."""
        return (isinstance(step, Dequantize) and len(step.out.shape) == 3 and step.algorithm not in NUMPY_ONLY
                and self._numpy_dequantizes(step))

    def each_expert(self, step: Dequantize) -> Iterator[np.ndarray]:
        """The 3-D experts' output bits, expert e's [in, out] at a time, reading one expert's inputs at a time. The
        whole path's refusals (same functions, same words) come first, before any expert is made: they need every
        block-scale code present, so the block scales are read twice, one expert's at a time (1/32 of a BF16 output)."""
        packed, scales = self.experts(step.inputs[0], step.source), self.experts(step.inputs[1], step.source)
        scale_2 = self._scalar(step.inputs[2], step.source)
        counts = np.zeros(256, dtype=np.int64)  # how many blocks have each code
        for scale in scales:
            counts += np.bincount(scale.reshape(-1), minlength=256)
        present = np.nonzero(counts)[0].astype(np.uint8).tobytes()  # its problem depends on the codes present alone
        self._refuse_scale(step, 2, scale_values.nvfp4_problem(present, scale_2, self._divisor, step.out.dtype))
        self._refuse_non_finite(step, int(counts[dequant_table.non_finite_codes(scale_2, step.out.dtype, self._divisor)].sum()))
        return dequant_table.each_expert(packed, scales, scale_2, step.out.dtype, self._divisor)

    def _fp8_bits(self, step: Dequantize) -> np.ndarray:
        """FP8 per-tensor: one table of 256 products (ModelOpt's FP8QTensor.dequantize, bitwise)."""
        weight = self._array(step.inputs[0], step.source, np.uint8)
        scale = self._scalar(step.inputs[1], step.source)
        table = fp8_table.byte_table(scale, step.out.dtype)
        counts = np.bincount(weight.reshape(-1), minlength=256)  # how often each byte occurs
        problem = scale_values.fp8_problem(scale, step.out.dtype, lambda: np.nonzero(counts)[0])
        if problem:  # the plan-time check's function and words (planning/dequantize.py)
            shard, info = self._sources[step.source][step.inputs[1]]
            raise BadInput(fp8_scale_error(f"{shard.path}: {info.name}", problem))
        self._refuse_non_finite(step, int(counts[dequant_table.non_finite(table, step.out.dtype)].sum()))
        return table[weight]

    def _fp8_block_bits(self, step: Dequantize) -> np.ndarray:
        """FP8 block 128x128 (DeepSeek's layout): each code times its block's scale (codec/fp8_block.py)."""
        shard, info = self._sources[step.source][step.inputs[1]]
        scales = fp8_block.scales(self._array(step.inputs[1], step.source, np.uint8 if info.dtype == "F8_E8M0" else np.dtype("<f4")),
                                  info.dtype)
        problem = fp8_block.scale_problem(scales, step.out.dtype)  # the plan-time check's function and words
        if problem:
            raise BadInput(f"{shard.path}: {info.name}: {problem}; {BROKEN_EXPORT}")
        bits = fp8_block.dequantize(self._array(step.inputs[0], step.source, np.uint8), scales, step.out.dtype)
        self._refuse_non_finite(step, int(np.count_nonzero(dequant_table.non_finite(bits, step.out.dtype))))
        return bits

    def _scalar(self, name: str, source: str) -> float:
        return float(self._array(name, source, np.dtype("<f4")).reshape(-1)[0])

    def _floats(self, name: str, source: str) -> np.ndarray:
        """A small float tensor (BF16, F16 or F32) as float32 values."""
        info = self._sources[source][name][1]
        return float_bits.to_float32(self._array(name, source, np.dtype(float_bits.BITS[info.dtype])), info.dtype)

    def info(self, name: str, source: str = "checkpoint") -> TensorInfo:
        return self._sources[source][name][1]

    def experts(self, name: str, source: str = "checkpoint") -> ExpertReader:
        """A 3-D tensor, read one expert at a time as it is used."""
        return ExpertReader(*self._sources[source][name])

    def _array(self, name: str, source: str, dtype: np.dtype) -> np.ndarray:
        shard, info = self._sources[source][name]
        return np.frombuffer(read_tensor(shard, info), dtype=dtype).reshape(info.shape)

    def _requantized(self, step: Requantize) -> dict[str, torch.Tensor]:
        """Quantize the original weight with the fused group's shared global scale (max over members)."""
        import torch

        from repair.codec import fp8, nvfp4

        cached = getattr(self._local, "cache", {}).get(step.module)
        if cached is None:
            weights = [self.load(n, step.source) for n in step.inputs]
            if step.algorithm == "FP8":  # ModelOpt's FP8 export: the group's largest amax / 448
                weight, scale = fp8.quantize(weights[0], torch.stack([fp8.weight_scale(w) for w in weights]).amax())
                cached = {"weight": weight, "weight_scale": scale.reshape(())}
            else:
                scale_2 = torch.stack([nvfp4.global_scale(w) for w in weights]).amax()
                packed, scale, scale_2 = nvfp4.quantize(weights[0], scale_2)
                cached = {"weight": packed, "weight_scale": scale, "weight_scale_2": scale_2.reshape(())}
            self._local.cache = {step.module: cached}  # one module at a time, per thread
        return cached
