"""Cases that break the packed NVFP4 modules the repair touches: missing or misshapen scales, odd packed
dims, NaN block scales and bad global scales (weight_scale_2).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from .edits import ONE, assistant, edit_tensors
from .registry import CASES, Case, case


def _scale_2(value: float, says: str) -> Callable[[Path], Case]:
    def builder(work: Path) -> Case:
        import torch

        src = assistant(work)
        edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight_scale_2": torch.tensor(value)}))
        return Case(src, f"pre_projection.weight_scale_2: global scale {says}")
    return builder


@case
def missing_weight_scale(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.pop("pre_projection.weight_scale"))
    return Case(src, "pre_projection.weight: packed NVFP4 weight without its weight_scale")


@case
def missing_weight_scale_2(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.pop("pre_projection.weight_scale_2"))
    return Case(src, "pre_projection.weight: packed NVFP4 weight without its weight_scale_2")


@case
def weight_scale_wrong_shape(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight_scale": t["pre_projection.weight_scale"].reshape(32, 24)}))
    return Case(src, "pre_projection.weight_scale: F8_E4M3 [32, 24] does not fit packed weight [64, 96]")


@case
def odd_packed_dims(work):
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight": t["pre_projection.weight"][:, :95].contiguous()}))
    return Case(src, "pre_projection.weight: packed shape [64, 95] unpacks to 190 input columns, not a multiple of the 16")


@case
def nan_block_scales(work):
    src = assistant(work)

    def poison(tensors):
        import torch

        tensors["pre_projection.weight_scale"].view(torch.uint8)[0, :3] = 0x7F  # E4M3 NaN
    edit_tensors(src / ONE, poison)
    return Case(src, "pre_projection.weight_scale: 3 NaN and 0 negative block scales")


for _name, _value, _says in (("scale_2_nan", float("nan"), "is NaN"), ("scale_2_inf", float("inf"), "is infinite"),
                             ("scale_2_zero", 0.0, "is 0.0 (must be > 0)"), ("scale_2_negative", -0.25, "is -0.25 (must be > 0)")):
    CASES[_name] = _scale_2(_value, _says)


@case
def scale_2_overflows_bf16(work):  # finite and positive, so it passes the scale checks; x 448 x 6 is past BF16's range
    import torch

    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight_scale_2": torch.tensor(3e38)}))
    return Case(src, "pre_projection.weight_scale_2: block scale x global scale reaches")


@case
def packed_weight_3d(work):  # the same bytes reshaped: once kept as U8 under a BF16 declaration, its scales dropped
    src = assistant(work)
    edit_tensors(src / ONE, lambda t: t.update({"pre_projection.weight": t["pre_projection.weight"].reshape(2, 32, 96)}))
    return Case(src, "pre_projection.weight: packed NVFP4 weight is 3-D [2, 32, 96]")
