"""NVFP4_AWQ to full precision against ModelOpt: its export (NVFP4 weight + pre_quant_scale), its own fold, and the layer's function."""

import json

import numpy as np
import pytest
import torch

from repair.codec import awq
from tools.modelopt_export import modelopt_dequantize
from tools.modelopt_oracles import fold_pre_quant_scale, nvfp4_awq_export

NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def awq_layer(seed, out_features=48, in_features=128, dtype=torch.bfloat16):
    """A ModelOpt NVFP4_AWQ export of a random Linear with a wide per-channel scale (0.02 .. 50), plus its calibration inputs."""
    gen = torch.Generator().manual_seed(seed)
    weight = (torch.randn(out_features, in_features, generator=gen) * 0.05).to(dtype)
    channel = 10 ** torch.empty(in_features).uniform_(-1.7, 1.7, generator=gen)
    inputs = torch.randn(16, in_features, generator=gen) * channel  # outlier channels, what AWQ smooths
    return nvfp4_awq_export(weight, channel.sqrt().to(dtype), inputs), inputs


@pytest.fixture(scope="module")
def layers():
    return [awq_layer(seed) for seed in range(3)]


def ours(tensors, dtype):
    bits = awq.dequantize(tensors["weight"].numpy(), tensors["weight_scale"].view(torch.uint8).numpy(),
                          tensors["weight_scale_2"].item(), tensors["pre_quant_scale"].float().numpy(), NAMES[dtype])
    return torch.from_numpy(bits).view(dtype)


def same_bits(a, b):
    width = {2: torch.int16, 4: torch.int32}[a.dtype.itemsize]
    return a.dtype == b.dtype and torch.equal(a.view(width), b.view(width))


def test_export_is_nvfp4_awq_as_published(layers):
    tensors, _ = layers[0]
    assert tensors["weight"].dtype == torch.uint8 and tensors["weight_scale"].dtype == torch.float8_e4m3fn
    assert tensors["pre_quant_scale"].shape == (128,) and tensors["pre_quant_scale"].dtype == torch.bfloat16
    assert tensors["weight_scale_2"].shape == () and tensors["input_scale"].shape == ()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_fold_is_bitwise_modelopts_own_fold(layers, dtype):
    """ModelOpt's disable_pre_quant_scale_and_resmooth on its dequantized weight gives our bits exactly."""
    for tensors, inputs in layers:
        dequantized = modelopt_dequantize(tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"], dtype)
        theirs = fold_pre_quant_scale(dequantized, tensors["pre_quant_scale"], inputs)
        assert same_bits(ours(tensors, dtype), theirs)
        assert not same_bits(dequantized, theirs), "the scale changed nothing: the case proves nothing"


def test_folded_bf16_linear_keeps_the_layers_function(layers):
    """x @ folded.T equals ModelOpt's unquantized equivalent (x * pre_quant_scale) @ W.T within bf16 rounding.

    Both sides round one factor to bf16 (x * s, or W * s): relative error <= 2^-9 each, so
    |difference| <= 2^-8 * (|x| * s) @ |W|.T (+ 2^-16 of it for float32 sums of 128 terms), plus the bf16
    rounding of each output for the bf16 linear. Folding in float32 before rounding W fails this bound.
    """
    for tensors, inputs in layers:
        scale = tensors["pre_quant_scale"].float()
        weight = modelopt_dequantize(tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"], torch.bfloat16)
        x = inputs.bfloat16()
        reference = (x * tensors["pre_quant_scale"]).float() @ weight.float().T  # ModelOpt's forward, its bf16 input scaling
        folded = ours(tensors, torch.bfloat16)
        bound = (2.0**-8 + 2.0**-16) * (x.float().abs() * scale) @ weight.float().abs().T
        assert ((x.float() @ folded.float().T - reference).abs() <= bound).all()
        linear = torch.nn.functional.linear(x, folded).float()  # the BF16 layer the fixed checkpoint runs
        assert ((linear - reference).abs() <= bound + 2.0**-8 * reference.abs()).all()
        unfolded = x.float() @ weight.float().T
        assert ((unfolded - reference).abs() > bound).any(), "dropping the scale would pass too: the bound is too loose"


def test_chunking_does_not_change_results(layers, monkeypatch):
    tensors, _ = layers[1]
    whole = ours(tensors, torch.bfloat16)
    monkeypatch.setattr(awq, "CHUNK_ELEMENTS", 300)  # many odd-sized row chunks
    assert same_bits(whole, ours(tensors, torch.bfloat16))


def test_scale_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="pre_quant_scale has 8 values for a weight of 16 input columns"):
        awq.fold(np.zeros((2, 16), dtype=np.uint16), np.ones(8, dtype=np.float32), "BF16")


def test_every_pre_quant_scale_of_a_real_nvfp4_awq_export_folds_like_modelopt(tmp_path):
    """A whole-model export (tiny Llama): the tensors as written, and which modules keep a pre_quant_scale."""
    from safetensors import safe_open

    from tools.modelopt_awq_export import export_tiny_llama_awq

    out = export_tiny_llama_awq(tmp_path / "awq")
    assert json.loads((out / "hf_quant_config.json").read_text())["quantization"]["quant_algo"] == "NVFP4_AWQ"
    with safe_open(out / "model.safetensors", "pt") as f:
        modules = sorted(k.removesuffix(".pre_quant_scale") for k in f.keys() if k.endswith(".pre_quant_scale"))
        assert modules == [f"model.layers.{i}.self_attn.o_proj" for i in range(2)]  # the rest ModelOpt fused away
        for module in modules:
            tensors = {n: f.get_tensor(f"{module}.{n}") for n in ("weight", "weight_scale", "weight_scale_2", "pre_quant_scale")}
            dequantized = modelopt_dequantize(tensors["weight"], tensors["weight_scale"], tensors["weight_scale_2"])
            inputs = torch.ones(1, dequantized.shape[1])
            assert same_bits(ours(tensors, torch.bfloat16), fold_pre_quant_scale(dequantized, tensors["pre_quant_scale"], inputs))
