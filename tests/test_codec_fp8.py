"""The FP8 per-tensor codec against ModelOpt: bitwise dequant (FP8QTensor), bytewise quant (its HF export)."""

import subprocess
import sys

import pytest
import torch

from repair.codec import fp8
from tools.modelopt_oracles import fp8_dequantize, fp8_export

DTYPES = (torch.bfloat16, torch.float16, torch.float32)
EVERY_BYTE = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(16, 16)  # 0x7F/0xFF are NaN


def bits(tensor):
    return tensor.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[tensor.dtype.itemsize])


def assert_same_quant(weight):
    ours, scale = fp8.quantize(weight)
    theirs = fp8_export(weight)
    assert ours.dtype == theirs["weight"].dtype == torch.float8_e4m3fn
    assert torch.equal(bits(ours), bits(theirs["weight"])), f"{(bits(ours) != bits(theirs['weight'])).sum()} bytes differ"
    assert scale.dtype == torch.float32 and scale.shape == theirs["weight_scale"].shape == ()
    assert torch.equal(bits(scale), bits(theirs["weight_scale"]))
    return ours, scale


@pytest.mark.parametrize("scale", [1.0, 0.00837, 1 + 2**-8, 1 + 3 * 2**-9, 2.0**-20, 1e-30, 1e-39, 3e38, 7e4, 1e-8, 0.0, -0.5,
                                   float("inf"), float("nan")])
@pytest.mark.parametrize("dtype", DTYPES)
def test_dequantize_every_byte_matches_modelopt(scale, dtype):
    """Scales that round in bf16 (1 + 2^-8 is a tie), overflow or vanish in fp16 (7e4, 1e-8), are float32 subnormal (1e-39)."""
    weight_scale = torch.tensor(scale, dtype=torch.float32)
    ours = fp8.dequantize(EVERY_BYTE, weight_scale, dtype)
    theirs = fp8_dequantize(EVERY_BYTE, weight_scale, dtype)
    assert ours.dtype == theirs.dtype == dtype and ours.shape == (16, 16)
    assert torch.equal(bits(ours), bits(theirs))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16, 16), (64, 192), (7, 333)])
def test_random_weights_quantize_like_modelopts_export(seed, dtype, shape):
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(shape, generator=gen) * 10 ** torch.empty(shape[0], 1).uniform_(-3, 1, generator=gen)).to(dtype)
    packed, scale = assert_same_quant(weight)
    for out in DTYPES:
        assert torch.equal(bits(fp8.dequantize(packed, scale, out)), bits(fp8_dequantize(packed, scale, out)))


def fp8_grid():
    """Every finite non-negative E4M3 value (0 .. 448) as float32."""
    return torch.arange(0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_round_to_even(dtype):
    """amax 448 makes the scale exactly 1: each midpoint between two E4M3 neighbours is a tie (exact in bf16 too)."""
    grid = fp8_grid()
    midpoints = (grid[:-1] + grid[1:]) / 2
    weight = torch.cat([midpoints, -midpoints, grid, torch.tensor([448.0])]).reshape(1, -1).to(dtype)
    packed, scale = assert_same_quant(weight)
    assert scale.item() == 1.0
    codes = bits(packed)[0, : midpoints.numel()].long()
    assert (codes % 2 == 0).all(), "a tie did not round to the even code"


def test_double_rounding_through_the_weight_dtype():
    """A bf16 weight's quotient is rounded to bf16 before the FP8 cast (ModelOpt's export): ties appear that float32 would not."""
    gen = torch.Generator().manual_seed(7)
    weight = torch.randn(64, 256, generator=gen).bfloat16()
    packed, scale = assert_same_quant(weight)
    single = (weight.float() / scale).to(torch.float8_e4m3fn)
    assert not torch.equal(bits(single), bits(packed)), "the bf16 rounding made no difference: the case is not adversarial"


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros_negative_zero_and_tiny_values(dtype):
    """Zero rows, -0.0, and values far below amax / 448 that become E4M3 subnormals or flush to zero."""
    weight = torch.zeros(4, 32)
    weight[0] = torch.linspace(-3, 3, 32)
    weight[1, ::2] = -0.0
    weight[2] = torch.logspace(-8, -1, 32) * torch.tensor([1.0, -1.0]).repeat(16)
    assert_same_quant(weight.to(dtype))


@pytest.mark.parametrize("magnitude", [1e-38, 1e-30, 1e-5, 1e4, 1e30])
def test_tiny_and_huge_amax(magnitude):
    """A bf16/fp32 weight whose scale is subnormal in float32 (1e-38 / 448), or near the float32 maximum."""
    gen = torch.Generator().manual_seed(8)
    for dtype in (torch.bfloat16, torch.float32):
        assert_same_quant((torch.randn(16, 48, generator=gen) * magnitude).to(dtype))


def test_subnormal_bf16_weights():
    weight = (torch.arange(1, 65, dtype=torch.float32) * 1e-40).reshape(4, 16).bfloat16()  # every value a bf16 subnormal
    assert (weight.float().abs() < torch.finfo(torch.float32).tiny).all()
    assert_same_quant(weight)


def test_all_zero_weight_gets_zeros_and_scale_one_where_modelopt_writes_nan():
    """amax 0: ModelOpt's export divides 0 by 0 and writes NaN bytes with scale 0; we keep the zeros (scale 1.0)."""
    weight = torch.zeros(8, 16, dtype=torch.bfloat16)
    theirs = fp8_export(weight)
    assert theirs["weight_scale"].item() == 0.0 and theirs["weight"].float().isnan().all()
    packed, scale = fp8.quantize(weight)
    assert scale.item() == 1.0 and not bits(packed).any()
    assert not bits(fp8.dequantize(packed, scale)).any()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_weight_is_refused(bad, monkeypatch):
    monkeypatch.setattr(fp8, "CHUNK_ELEMENTS", 16)  # one row per chunk: the bad value is in the last one
    weight = torch.ones(3, 16)
    weight[2, 3] = bad
    with pytest.raises(ValueError, match="NaN or infinite"):
        fp8.quantize(weight)


def test_fused_siblings_share_the_largest_scale():
    """Given a group's max amax (what ModelOpt's preprocess_linear_fusion sets on siblings; its export does not fuse FP8
    per-tensor groups, formats/shared_scale.py), passing the max scale reproduces ModelOpt's quantizer."""
    gen = torch.Generator().manual_seed(10)
    gate, up = torch.randn(32, 64, generator=gen).bfloat16(), (3 * torch.randn(32, 64, generator=gen)).bfloat16()
    group_amax = torch.maximum(gate.abs().amax(), up.abs().amax())
    shared = torch.maximum(fp8.weight_scale(gate), fp8.weight_scale(up))
    for weight in (gate, up):
        packed, scale = fp8.quantize(weight, shared)
        theirs = fp8_export(weight, group_amax)
        assert torch.equal(bits(packed), bits(theirs["weight"])) and torch.equal(scale, theirs["weight_scale"])
    assert not torch.equal(bits(fp8.quantize(gate)[0]), bits(fp8_export(gate, group_amax)["weight"]))


def test_chunking_does_not_change_results(monkeypatch):
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(100, 96, generator=gen).bfloat16()
    whole = fp8.quantize(weight)
    monkeypatch.setattr(fp8, "CHUNK_ELEMENTS", 500)  # many odd-sized row chunks
    chunked = fp8.quantize(weight)
    assert torch.equal(bits(whole[0]), bits(chunked[0])) and torch.equal(whole[1], chunked[1])


def test_table_dequantize_imports_no_torch():
    """The executor's path (fp8_table) must not pay torch's import, like the NVFP4 table."""
    code = (
        "import sys, numpy as np\n"
        "from repair.codec import fp8_table\n"
        "out = fp8_table.dequantize(np.arange(256, dtype=np.uint8).reshape(16, 16), 0.5, 'BF16')\n"
        "assert out.dtype == np.uint16 and out.shape == (16, 16)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
