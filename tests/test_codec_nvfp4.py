"""The NVFP4 codec against ModelOpt's own NVFP4QTensor: bitwise dequant, bytewise quant."""

import pytest
import torch

from repair.codec import dequant_table, nvfp4
from tools.modelopt_export import modelopt_dequantize, modelopt_quantize


def assert_same_quant(weight, scale_2=None):
    ours = nvfp4.quantize(weight, scale_2)
    theirs = modelopt_quantize(weight, scale_2)
    assert torch.equal(ours[0], theirs[0]), "packed bytes differ"
    assert torch.equal(ours[1].view(torch.uint8), theirs[1].view(torch.uint8)), "block scales differ"
    assert torch.equal(ours[2].reshape(()), theirs[2].reshape(())), "global scale differs"
    assert ours[2].dtype == torch.float32 and ours[2].shape == ()
    return ours


def assert_same_dequant(packed, scale, scale_2, dtype=torch.bfloat16):
    ours = nvfp4.dequantize(packed, scale, scale_2, dtype)
    theirs = modelopt_dequantize(packed, scale, scale_2, dtype)
    assert ours.dtype == theirs.dtype == dtype
    bits = torch.int16 if dtype.itemsize == 2 else torch.int32
    assert torch.equal(ours.view(bits), theirs.view(bits))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", [(16, 16), (64, 192), (333, 512), (8, 4096)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_random_round_trip_matches_modelopt(seed, shape, dtype):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(shape, generator=gen) * 10 ** torch.empty(shape[0], 1).uniform_(-4, 2, generator=gen)).to(dtype)
    packed, scale, scale_2 = assert_same_quant(weight)
    assert_same_dequant(packed, scale, scale_2)
    assert_same_dequant(packed, scale, scale_2, torch.float32)


def exact_block(values):
    """A [1, 16] block whose effective scale is exactly 1 when scale_2 = 2^-8 (block amax 6)."""
    row = torch.tensor(list(values) + [6.0] * (16 - len(values)), dtype=torch.float32)
    return row.reshape(1, 16), torch.tensor(2.0**-8)


@pytest.mark.parametrize("tie", [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
def test_every_rounding_tie(tie):
    weight, scale_2 = exact_block([tie, -tie, tie + 1e-3, tie - 1e-3])
    packed, scale, _ = assert_same_quant(weight, scale_2)
    assert scale.float().item() == 256.0
    expected = {0.25: 0.0, 0.75: 1.0, 1.25: 1.0, 1.75: 2.0, 2.5: 2.0, 3.5: 4.0, 5.0: 4.0}[tie]
    values = nvfp4.dequantize(packed, scale, scale_2, torch.float32)[0]
    assert values[0].item() == expected and values[1].item() == -expected


def test_negatives_and_negative_zero():
    weight, scale_2 = exact_block([-0.0, 0.0, -0.1, -0.24, -0.5, -6.0, -7.0, 0.1])
    packed, scale, _ = assert_same_quant(weight, scale_2)
    codes = torch.stack([packed[0] & 0xF, packed[0] >> 4], -1).reshape(-1)
    assert codes[0].item() == 0  # -0.0 input is not negative
    assert codes[2].item() == 8  # a small negative rounds to the -0 code
    assert codes[6].item() == 15  # -7 saturates to -6
    assert_same_dequant(packed, scale, scale_2)


def test_all_zero_blocks_get_scale_one():
    weight = torch.zeros(4, 64, dtype=torch.bfloat16)
    weight[0, :16] = 1.0
    packed, scale, scale_2 = assert_same_quant(weight)
    assert scale[1:].float().eq(1.0).all() and scale[0, 1:].float().eq(1.0).all()
    assert_same_dequant(packed, scale, scale_2)


def test_all_zero_tensor():
    weight = torch.zeros(16, 32, dtype=torch.bfloat16)
    packed, scale, scale_2 = assert_same_quant(weight)
    assert scale_2.item() == 0.0
    assert_same_dequant(packed, scale, scale_2)


@pytest.mark.parametrize("magnitude", [1e-30, 1e-12, 1e-6, 1e3, 1e20, 3e38])
def test_tiny_and_huge_scales(magnitude):
    gen = torch.Generator().manual_seed(1)
    weight = torch.randn(32, 64, generator=gen) * magnitude
    weight[0] *= 1e-6  # blocks far below the global amax: the fp8 clamp at 2^-9 applies
    packed, scale, scale_2 = assert_same_quant(weight)
    assert_same_dequant(packed, scale, scale_2, torch.float32)


def test_saturation_with_a_given_global_scale():
    gen = torch.Generator().manual_seed(2)
    weight = torch.randn(16, 64, generator=gen).to(torch.bfloat16)
    too_small = nvfp4.global_scale(weight) / 1000  # block scales overflow 448 and clamp; values saturate at 6
    packed, scale, _ = assert_same_quant(weight, too_small)
    assert scale.float().max().item() == 448.0
    assert ((packed & 0x7) == 7).any()


def test_dequantize_every_byte_and_every_scale():
    codes = torch.arange(256, dtype=torch.uint8)
    every = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)  # 0x7F and 0xFF are NaN
    packed = codes.repeat(256, 1)  # [256, 256] -> logical [256, 512]: 32 blocks per row
    scale = every.reshape(-1, 1).view(torch.uint8).repeat(1, 32).view(torch.float8_e4m3fn)
    for scale_2 in (1.0, 2.0**-20, 0.00372, 1e30, float("inf"), float("nan"), 0.0, -1.0):
        for dtype in (torch.bfloat16, torch.float16, torch.float32):
            assert_same_dequant(packed, scale, torch.tensor(scale_2), dtype)


def test_torch_free_dequantize_is_the_same_table(monkeypatch):
    """The executor's numpy path (no torch import) gives nvfp4.dequantize's bits, chunked or not."""
    gen = torch.Generator().manual_seed(6)
    packed, scale, scale_2 = nvfp4.quantize(torch.randn(96, 512, generator=gen).bfloat16())
    want = nvfp4.dequantize(packed, scale, scale_2).view(torch.int16).numpy()
    monkeypatch.setattr(dequant_table, "CHUNK_ELEMENTS", 700)
    got = dequant_table.dequantize(packed.numpy(), scale.view(torch.uint8).numpy(), scale_2.item(), "BF16")
    assert got.dtype.itemsize == 2 and (got.view("int16") == want).all()


def test_fused_siblings_share_a_given_global_scale():
    gen = torch.Generator().manual_seed(3)
    gate, up = torch.randn(64, 64, generator=gen).bfloat16(), (3 * torch.randn(64, 64, generator=gen)).bfloat16()
    shared = torch.maximum(nvfp4.global_scale(gate), nvfp4.global_scale(up))
    assert_same_quant(gate, shared)
    assert_same_quant(up, shared)


def test_chunking_does_not_change_results(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(100, 256, generator=gen).bfloat16()
    whole = nvfp4.quantize(weight)
    monkeypatch.setattr(nvfp4, "CHUNK_ELEMENTS", 700)  # forces many odd-sized row chunks
    monkeypatch.setattr(dequant_table, "CHUNK_ELEMENTS", 700)
    chunked = nvfp4.quantize(weight)
    assert torch.equal(whole[0], chunked[0]) and torch.equal(whole[1].view(torch.uint8), chunked[1].view(torch.uint8))
    assert torch.equal(nvfp4.dequantize(*whole).view(torch.int16), nvfp4.dequantize(*chunked).view(torch.int16))


def test_canonical_codes_make_round_trip_byte_identical():
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(32, 128, generator=gen).bfloat16()
    packed, scale, scale_2 = nvfp4.quantize(weight)
    again = nvfp4.quantize(nvfp4.dequantize(packed, scale, scale_2), scale_2)
    assert not torch.equal(again[0], packed)  # -0 codes are lost by dequantizing
    assert torch.equal(nvfp4.canonical_codes(again[0]), nvfp4.canonical_codes(packed))
