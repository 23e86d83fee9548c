"""W4A16_NVFP4 needs no codec of its own: ModelOpt exports the NVFP4 weight tensors, byte for byte, without input_scale."""

import torch

from repair.codec import nvfp4
from tools.modelopt_oracles import w4a16_nvfp4_export


def test_w4a16_export_is_the_nvfp4_codecs_output_without_activation_scale():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=gen).bfloat16()
    exported = w4a16_nvfp4_export(weight, torch.randn(8, 64, generator=gen))
    assert sorted(exported) == ["weight", "weight_scale", "weight_scale_2"]  # no input_scale
    packed, scale, scale_2 = nvfp4.quantize(weight)
    assert torch.equal(exported["weight"], packed)
    assert torch.equal(exported["weight_scale"].view(torch.uint8), scale.view(torch.uint8))
    assert torch.equal(exported["weight_scale_2"], scale_2)
