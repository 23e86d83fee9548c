"""TensorRT-LLM's copy path as doctor predicts it, against torch itself (the parts of it that run here).

Source (tests/data/trtllm/PROVENANCE.md): `tensorrt_llm/_torch/modules/linear.py` at NVIDIA/TensorRT-LLM
00bbf71e796406ea8593a77cbfb828356182db16: `load_weight_shard` slices the checkpoint tensor by its own width
(ceil(width / tp) per rank, a width of 1 not split); `copy_weight` casts to the parameter's dtype
(`src.to(dst.dtype)`) and then `dst.data.copy_(src)`; the fused loaders `torch.cat` their shards along dim 0. The
error texts doctor prints are torch's: here they are checked against torch's own (meta tensors, no data).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from repair.targets import copy_weight

SHAPES = [(4, 8), (4, 4), (4, 1), (1, 8), (8,), (0, 8), (2, 4, 8), (6, 8), (4, 16), (3, 8)]


def torch_error(fn) -> str | None:
    try:
        fn()
    except RuntimeError as e:
        return f"RuntimeError: {e}"
    return None


def meta(shape, dtype=torch.bfloat16):
    return torch.empty(shape, dtype=dtype, device="meta")


@pytest.mark.parametrize("dst,src", list(itertools.product(SHAPES, SHAPES)))
def test_copy_error_is_torchs_own(dst, src):
    # copy_weight casts first: a packed uint8 or float8 source gives the same shape outcome as a bf16 one
    for dtype in (torch.uint8, torch.float8_e4m3fn, torch.bfloat16):
        expected = torch_error(lambda: meta(dst).copy_(meta(src, dtype).to(torch.bfloat16)))
        assert copy_weight.copy_error(dst, src) == expected, (dst, src, dtype)


@pytest.mark.parametrize("parts", [[(2, 4), (2, 8)], [(2, 4), (2, 4), (3, 8)], [(2, 4), (1, 4)], [(4, 8), (2, 8), (2, 8)]])
def test_cat_error_is_torchs_own(parts):
    expected = torch_error(lambda: torch.cat([meta(p) for p in parts]))
    assert copy_weight.cat_error(parts) == expected
    if expected is None:
        assert copy_weight.cat_shape(parts) == tuple(torch.cat([meta(p) for p in parts]).shape)


@pytest.mark.parametrize("width,tp", [(8, 2), (9, 2), (7, 4), (1, 4), (3, 4), (4096, 2), (100, 8)])
def test_rank_slice_takes_ceil_of_the_checkpoint_width(width, tp):
    """load_weight_shard: slice_width = ceil(width / tp), rank r takes [r*w, min((r+1)*w, width))."""
    full = torch.arange(width * 2).reshape(2, width)
    step = math.ceil(width / tp)
    for rank in range(tp):
        expected = full[:, rank * step: min((rank + 1) * step, width)] if width != 1 else full
        assert copy_weight.rank_slice((2, width), 1, tp, rank) == tuple(expected.shape)
