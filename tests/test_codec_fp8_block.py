"""FP8 block 128x128 dequantize (DeepSeek's layout) against torch's own arithmetic, bitwise.

DeepSeek's reference (`weight_dequant` of its inference code) multiplies each float8_e4m3fn code by its block's scale
in float32 and casts the product to the output dtype once; vLLM registers the same scales (`weight_scale_inv`, e8m0
or float32). Every byte, ragged edge blocks, e8m0 and float32 scales, and the refusals."""

import numpy as np
import pytest
import torch

from repair.codec import fp8_block

DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}


def reference(codes: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    out, inn = codes.shape
    full = scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[:out, :inn]
    return (codes.float() * full).to(dtype)


def bits(t: torch.Tensor) -> np.ndarray:
    return t.view({2: torch.int16, 4: torch.int32}[t.dtype.itemsize]).numpy().view({2: np.uint16, 4: np.uint32}[t.dtype.itemsize])


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("scale_dtype", [torch.float8_e8m0fnu, torch.float32])
@pytest.mark.parametrize("shape", [(256, 384), (300, 130), (5, 7)])
def test_matches_torch_bitwise(dtype, scale_dtype, shape):
    gen = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    codes[(codes & 0x7F) == 0x7F] = 0x00  # float8_e4m3fn NaN codes: no checkpoint holds them
    blocks = (-(-shape[0] // 128), -(-shape[1] // 128))
    if scale_dtype == torch.float32:
        scale = torch.rand(blocks, generator=gen) * 1e-2 + 1e-5
    else:
        scale = torch.exp2(torch.randint(-20, 0, blocks, generator=gen).float()).to(scale_dtype)
    raw = scale.view(torch.uint8).numpy() if scale_dtype != torch.float32 else scale.numpy()
    ours = fp8_block.dequantize(codes.numpy(), fp8_block.scales(raw, "F8_E8M0" if scale_dtype != torch.float32 else "F32"), dtype)
    theirs = reference(codes.view(torch.float8_e4m3fn), scale, DTYPES[dtype])
    assert ours.shape == shape and np.array_equal(ours, bits(theirs))


def test_every_code_in_one_block():
    codes = np.arange(256, dtype=np.uint8).reshape(16, 16)
    codes[(codes & 0x7F) == 0x7F] = 0
    scale = np.array([[2.0 ** -7]], dtype=np.float32)
    ours = fp8_block.dequantize(codes, scale, "BF16")
    assert np.array_equal(ours, bits(reference(torch.from_numpy(codes).view(torch.float8_e4m3fn), torch.from_numpy(scale), torch.bfloat16)))


@pytest.mark.parametrize("raw,dtype,said", [
    (np.array([[0xFF]], dtype=np.uint8), "F8_E8M0", "NaN"),
    (np.array([[np.nan]], dtype=np.float32), "F32", "NaN"),
    (np.array([[0.0]], dtype=np.float32), "F32", "not positive"),
    (np.array([[-1.0]], dtype=np.float32), "F32", "not positive"),
    (np.array([[3e38]], dtype=np.float32), "F32", "overflow"),
    (np.array([[250]], dtype=np.uint8), "F8_E8M0", "overflow"),
])
def test_scale_problems_are_named(raw, dtype, said):
    problem = fp8_block.scale_problem(fp8_block.scales(raw, dtype), "BF16")
    assert problem is not None and said in problem, problem


def test_good_scales_have_no_problem():
    assert fp8_block.scale_problem(np.array([[2.0 ** -9, 1e-3]], dtype=np.float32), "BF16") is None
