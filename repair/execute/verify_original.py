"""Checking that --original really is the model the checkpoint was quantized from, and measuring
how far each packed module is from it.

The check that matters: quantizing the original's weight with the checkpoint's own
`weight_scale_2` must reproduce the stored packed bytes (sign of zero aside) and block scales (FP8: its
`weight_scale` the stored bytes; NVFP4_AWQ weights, smoothed by a calibrated scale, are not checked).
A different model (another seed, another size) reproduces nothing and is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from repair.codec import fp8, nvfp4
from repair.codec.nvfp4 import BLOCK
from repair.io import tensors
from repair.execute.compute import Computer
from repair.execute.parallel import in_order
from repair.errors import BadInput
from repair.formats.nvfp4_packed import block_scale_shape
from repair.planning.model import Plan

ERROR_ROWS = 16 * 16  # an expert's input rows per step of its error (whole 16-row blocks: the block scales' rows)
FLOAT_WEIGHTS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # what an original's weight may be
CORRUPT_RELATIVE_ERROR = 0.25  # NVFP4's normal relative error on real weights is about 0.1


@dataclass(frozen=True)
class OriginalAssessment:
    verified: tuple[str, ...]
    mismatched: tuple[str, ...]  # do not reproduce: values differ, or the original's weight is not finite
    errors: dict[str, float]  # module -> relative error of its NVFP4 copy against the original
    forced: bool
    non_finite: tuple[str, ...] = ()  # original weights holding NaN or infinities, or not float data (never taken)

    def as_dict(self) -> dict:
        return {
            "verified": len(self.verified), "checked": len(self.verified) + len(self.mismatched),
            "mismatched": list(self.mismatched), "non_finite": list(self.non_finite), "forced": self.forced,
            "relative_error": {k: round(v, 6) for k, v in sorted(self.errors.items())},
            "corrupted": sorted(k for k, v in self.errors.items() if not v <= CORRUPT_RELATIVE_ERROR),  # NaN counts
        }

    @property
    def summary(self) -> str:
        total = len(self.verified) + len(self.mismatched)
        return f"original verified: {len(self.verified)} of {total} modules reproduce byte-for-byte"


def assess_original(plan: Plan, force: bool = False, jobs: int = 1) -> OriginalAssessment:
    """Verify the original against every packed module, or raise BadInput.

    Most packed modules must reproduce byte-for-byte (a few may not: a checkpoint module the
    exporter corrupted is what --original repairs); fewer is another model, refused unless
    `force`. A weight holding NaN or infinities is refused whenever the plan takes it, even with
    `force`: it would be written into OUT as is. `jobs` modules are checked at once (execute/parallel.py).
    """
    ckpt, original = plan.source, plan.original
    computer = Computer(ckpt.locate(), original.locate())
    # NVFP4_AWQ weights are smoothed by a calibrated pre_quant_scale: the original cannot reproduce them, so they say nothing
    packed = [m for m in plan.format.group_modules(ckpt.infos()) if m.is_quantized and m.algorithm != "NVFP4_AWQ"]
    orig_infos = original.infos()
    verified, mismatched, errors, non_finite = [], [], {}, []
    for m, (same, error) in in_order(packed, lambda m: _check(computer, orig_infos, m), lambda m: True, jobs):
        if error is not None:
            errors[m.name] = error
        if same is None:  # the original's weight is not float data, or not finite
            non_finite.append(m.weight_name)
        (verified if same else mismatched).append(m.name)
    checked = {m.weight_name for m in packed}
    non_finite += [n for n in _taken(plan) if n not in checked and not _original_finite(computer, n)]
    result = OriginalAssessment(tuple(verified), tuple(mismatched), errors, force, tuple(non_finite))
    _refuse_garbage(plan, result, _taken(plan))
    if packed and 2 * len(verified) <= len(packed) and not force:
        raise BadInput(
            f"{original.root}: not the original of {ckpt.root} ({result.summary}: "
            f"e.g. {mismatched[0]}); pass the model this checkpoint was quantized from, or --force"
        )
    return result


def _check(computer: Computer, orig_infos: dict, m) -> tuple[bool | None, float | None]:
    """One packed module against the original: (reproduced, relative error); (False, None) when the original has
    no such weight or another shape, or the module lacks a scale its codes need (a broken export --original
    repairs: nothing to reproduce), (None, None) when its weight is not finite float data. Any thread."""
    name = m.weight_name
    scales = ("weight_scale",) if m.algorithm == "FP8" else ("weight_scale", "weight_scale_2")
    if name not in orig_infos or orig_infos[name].shape != m.logical_shape or not all(m.tensor(r) for r in scales):
        return False, None
    if m.algorithm != "FP8" and not _scales_fit(computer, m):
        return False, None
    if len(m.logical_shape) == 3 and m.algorithm != "FP8":
        return _experts_reproduce(computer, m)
    weight = computer.load(name, "original")
    if not _float_weight(weight):
        return None, None
    return (_fp8_reproduces if m.algorithm == "FP8" else _nvfp4_reproduces)(computer, m, weight)


def _scales_fit(computer: Computer, m) -> bool:
    """The stored block scales are F8_E4M3 [out, in/16] (3-D experts: [E, in/16, out]) and the global scale an F32
    scalar, as `check_packed` asks of a module it dequantizes: scales of another shape are a broken export whose codes
    reproduce nothing (one expert's scales short or extra would be read past, or beside, the packed experts)."""
    scale, scale_2 = computer.info(m.tensor("weight_scale")), computer.info(m.tensor("weight_scale_2"))
    return (scale.dtype == "F8_E4M3" and scale.shape == block_scale_shape(m.logical_shape)
            and scale_2.dtype == "F32" and scale_2.shape in ((), (1,)))


def _nvfp4_reproduces(computer: Computer, m, weight: torch.Tensor) -> tuple[bool, float]:
    """(quantizing the original with the stored global scale gives the stored codes and block scales, relative error)."""
    stored = [computer.load(m.tensor(r)) for r in ("weight", "weight_scale", "weight_scale_2")]
    same = _same_codes(nvfp4.quantize(weight.contiguous(), stored[2]), stored[0], stored[1])
    return same, _relative_error(nvfp4.dequantize(*stored, torch.float32), weight)


def _experts_reproduce(computer: Computer, m) -> tuple[bool | None, float | None]:
    """`_nvfp4_reproduces` of ModelOpt's BMM experts, one expert at a time: memory holds one expert of the original,
    of the stored bytes and of float32 temporaries, never the tensor (a gpt-oss-120b gate_up_proj is 4 GiB in BF16,
    16 GiB in float32). Each expert is quantized as its [out, in] Linear and stored transposed; the error's squared
    norms are summed over experts. (None, None) as `_check` says, at the first expert that is not finite float data."""
    originals = computer.experts(m.weight_name, "original")
    packed, scales = computer.experts(m.tensor("weight")), computer.experts(m.tensor("weight_scale"))
    scale_2 = computer.load(m.tensor("weight_scale_2"))
    same, error, norm = True, 0.0, 0.0
    for e in range(len(originals)):
        weight = tensors.from_bytes(originals.part(e), originals.expert)
        truth = weight.float() if weight.dtype in FLOAT_WEIGHTS else None  # `_float_weight`'s test, its float32 kept
        if truth is None or not bool(truth.isfinite().all()):
            return None, None
        p, s = torch.from_numpy(packed[e]), torch.from_numpy(scales[e]).view(torch.float8_e4m3fn)
        same = same and _same_codes(nvfp4.quantize(weight.t().contiguous(), scale_2), p.t(), s.t())
        norm += truth.norm().item() ** 2
        for lo in range(0, weight.shape[0], ERROR_ROWS):  # the dequantized expert a few rows at a time
            hi = min(weight.shape[0], lo + ERROR_ROWS)
            approx = nvfp4.dequantize(p[None, lo // 2:hi // 2], s[None, lo // BLOCK:hi // BLOCK], scale_2, torch.float32)[0]
            error += approx.sub_(truth[lo:hi]).norm().item() ** 2
    return same, math.sqrt(error) / math.sqrt(norm) if norm else 0.0


def _same_codes(again, packed: torch.Tensor, scale: torch.Tensor) -> bool:
    return torch.equal(nvfp4.canonical_codes(again[0]), nvfp4.canonical_codes(packed.contiguous())) and torch.equal(
        again[1].view(torch.uint8), scale.contiguous().view(torch.uint8))


def _fp8_reproduces(computer: Computer, m, weight: torch.Tensor) -> tuple[bool, float]:
    """The same for FP8 per-tensor: the stored scale (the fused group's) quantizes the original to the stored bytes."""
    stored, scale = computer.load(m.tensor("weight")), computer.load(m.tensor("weight_scale"))
    again, _ = fp8.quantize(weight if weight.dtype in fp8.OUT_DTYPES else weight.float(), scale)
    return torch.equal(again.view(torch.uint8), stored.view(torch.uint8)), _relative_error(fp8.dequantize(stored, scale, torch.float32), weight)


def _taken(plan: Plan) -> list[str]:
    """Every original tensor the plan writes into OUT (copied, cast or requantized)."""
    names = {n for c in plan.changes for step in c.outputs if step.source == "original" for n in step.inputs}
    return sorted(names)


def _refuse_garbage(plan: Plan, result: OriginalAssessment, taken: list[str]) -> None:
    bad = [n for n in result.non_finite if n in taken]
    if bad:
        raise BadInput(f"{plan.original.root}: {bad[0]}: holds NaN or infinite values, or is not a floating-point tensor ({len(bad)} such tensor(s) the repair "
                       "would take); nothing was written; re-download the original, or leave these modules out of the recipe")


def _original_finite(computer: Computer, name: str) -> bool:
    """An original tensor the plan takes holds no NaN or infinity; a 3-D one read one expert at a time."""
    if len(computer.info(name, "original").shape) != 3:
        return _finite(computer.load(name, "original"))
    experts = computer.experts(name, "original")
    return all(_finite(tensors.from_bytes(experts.part(e), experts.expert)) for e in range(len(experts)))


def _finite(weight: torch.Tensor) -> bool:
    return bool(weight.isfinite().all()) if weight.is_floating_point() else True


def _float_weight(weight: torch.Tensor) -> bool:
    """A weight the original may hold: 16-64 bit float, finite even in float32 (which quantizing and
    the error measure compute in; F64 1e300 is not). FP8 or bool has no isfinite in torch at all."""
    return weight.dtype in FLOAT_WEIGHTS and bool(weight.float().isfinite().all())


def _relative_error(approx: torch.Tensor, truth: torch.Tensor) -> float:
    truth = truth.float()
    norm = truth.norm().item()
    return (approx - truth).norm().item() / norm if norm else 0.0
