"""ModelOpt's own FP8 and NVFP4_AWQ code paths on one Linear, on CPU: the oracles for our codecs.

Each function drives nvidia-modelopt 0.47 (`mtq.quantize` with max calibration, then the HF
export's per-module `_export_quantized_weight`), the same code `export_hf_checkpoint` runs per
Linear. ModelOpt's AWQ search (`NVFP4_AWQ_*_CFG`) cannot run on CPU: it fake-quantizes NVFP4
in its forward, and that kernel asserts CUDA ("amax must be a CUDA tensor for dynamic block
quantization"). So `nvfp4_awq_export` ends the way awq_lite ends, with ModelOpt's
`apply_pre_quant_scale_and_smooth(linear, pre_quant_scale)` given a chosen scale instead of a
searched one, and the export then takes its NVFP4_AWQ path.
"""

from __future__ import annotations

import copy
import warnings

import torch

from tools.modelopt_export import _modelopt


def _quantized_linear(weight: torch.Tensor, cfg_name: str, inputs: torch.Tensor) -> torch.nn.Module:
    """A bias-free Linear holding `weight`, quantized with ModelOpt's `cfg_name` and max-calibrated on `inputs`."""
    mtq = _modelopt()[0]
    out_features, in_features = weight.shape
    model = torch.nn.Sequential(torch.nn.Linear(in_features, out_features, bias=False)).to(weight.dtype)
    with torch.no_grad():
        model[0].weight.copy_(weight)
    return mtq.quantize(model, copy.deepcopy(getattr(mtq, cfg_name)), lambda m: m(inputs.to(weight.dtype)))[0]


def _export(linear: torch.nn.Module, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The tensors ModelOpt's HF export writes for this Linear (names without the module prefix)."""
    from modelopt.torch.export.unified_export_hf import _export_quantized_weight

    with torch.inference_mode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To copy construct from a tensor")  # ModelOpt's FP8 scale, per-channel branch
        _export_quantized_weight(linear, dtype)
    names = ("weight", "weight_scale", "weight_scale_2", "input_scale")
    return {n: getattr(linear, n).detach().clone() for n in names if getattr(linear, n, None) is not None}


def fp8_export(weight: torch.Tensor, group_amax: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """FP8_DEFAULT_CFG quantization and export of `weight`: float8 weight, float32 weight_scale and input_scale.

    group_amax: what the export's `preprocess_linear_fusion` sets on fused siblings (the group's max amax).
    """
    linear = _quantized_linear(weight, "FP8_DEFAULT_CFG", torch.ones(1, weight.shape[1]))
    if group_amax is not None:
        linear.weight_quantizer.amax = group_amax
    return _export(linear, weight.dtype)


def w4a16_nvfp4_export(weight: torch.Tensor, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """W4A16_NVFP4_CFG quantization and export of `weight`: NVFP4 weight tensors, activations unquantized."""
    return _export(_quantized_linear(weight, "W4A16_NVFP4_CFG", inputs), weight.dtype)


def fp8_dequantize(weight: torch.Tensor, weight_scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """ModelOpt's FP8QTensor.dequantize of an exported FP8 weight."""
    _modelopt()  # the import, with its known noise silenced
    from modelopt.torch.quantization.qtensor import FP8QTensor

    return FP8QTensor(weight.shape, dtype, weight).dequantize(dtype=dtype, scale=weight_scale)


def _record_activation_amax(linear: torch.nn.Module, inputs: torch.Tensor) -> None:
    """What awq_lite records before smoothing: the per-input-channel activation amax."""
    linear.input_quantizer._amax_for_smoothing = inputs.float().abs().amax(0)


def nvfp4_awq_export(weight: torch.Tensor, pre_quant_scale: torch.Tensor, inputs: torch.Tensor) -> dict[str, torch.Tensor]:
    """NVFP4 quantization of `weight` smoothed by ModelOpt with `pre_quant_scale`, then exported (NVFP4_AWQ).

    Returns weight (packed), weight_scale, weight_scale_2, input_scale and pre_quant_scale, as written.
    """
    linear = _quantized_linear(weight, "NVFP4_DEFAULT_CFG", inputs)  # imports modelopt, silencing its noise
    from modelopt.torch.export.quant_utils import get_quantization_format
    from modelopt.torch.quantization.model_calib import apply_pre_quant_scale_and_smooth

    _record_activation_amax(linear, inputs)
    apply_pre_quant_scale_and_smooth(linear, pre_quant_scale)
    if get_quantization_format(linear) != "nvfp4_awq":
        raise AssertionError(f"ModelOpt sees {get_quantization_format(linear)}, not nvfp4_awq")
    return {**_export(linear, weight.dtype), "pre_quant_scale": linear.input_quantizer._pre_quant_scale.clone()}


def fold_pre_quant_scale(weight: torch.Tensor, pre_quant_scale: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """ModelOpt's `disable_pre_quant_scale_and_resmooth` on a Linear holding `weight`: its folded weight."""
    linear = _quantized_linear(weight, "NVFP4_DEFAULT_CFG", inputs)
    from modelopt.torch.quantization.model_calib import disable_pre_quant_scale_and_resmooth

    _record_activation_amax(linear, inputs)
    linear.input_quantizer.pre_quant_scale = pre_quant_scale
    disable_pre_quant_scale_and_resmooth(linear)
    return linear.weight.detach().clone()
