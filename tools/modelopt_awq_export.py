"""A real ModelOpt NVFP4_AWQ export of the tiny Llama, made on CPU.

ModelOpt's AWQ search (`NVFP4_AWQ_LITE_CFG`) cannot run on CPU (its NVFP4 fake-quant forward
asserts CUDA), so this does what awq_lite does around the search: max calibration with
NVFP4_DEFAULT_CFG, the per-input-channel activation amax recorded, then ModelOpt's
`apply_pre_quant_scale_and_smooth` on every quantized Linear with the scale sqrt(amax) (AWQ's
rule with alpha 0.5 and no search). `export_hf_checkpoint` then writes `quant_algo:
NVFP4_AWQ` and, as for any AWQ model, fuses what it can: q/k/v and gate/up scales go into the
input layernorms, down_proj's into up_proj's output rows, and only o_proj keeps a
`pre_quant_scale` tensor (its input width differs from v_proj's output under GQA).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch

from tools.modelopt_export import TINY_LLAMA, _build_tiny_llama, _modelopt


def _activation_amax(model: torch.nn.Module, prompts: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """Per-input-channel max |x| of every Linear over the prompts (what awq_lite caches)."""
    amax: dict[str, torch.Tensor] = {}

    def record(name):
        def hook(_module, args, _output):
            seen = args[0].detach().float().abs().reshape(-1, args[0].shape[-1]).amax(0)
            amax[name] = torch.maximum(amax.get(name, seen), seen)
        return hook

    hooks = [m.register_forward_hook(record(n)) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for ids in prompts:
            model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return amax


def export_tiny_llama_awq(out_dir: Path, seed: int = 0) -> Path:
    """NVFP4_AWQ export of the tiny Llama (calibrated on 4 seeded 8-token prompts)."""
    mtq, export_hf_checkpoint, _ = _modelopt()
    from modelopt.torch.quantization.model_calib import apply_pre_quant_scale_and_smooth

    model = _build_tiny_llama(seed)
    gen = torch.Generator().manual_seed(seed + 3)
    prompts = [torch.randint(0, TINY_LLAMA["vocab_size"], (1, 8), generator=gen) for _ in range(4)]
    amax = _activation_amax(model, prompts)
    model = mtq.quantize(model, copy.deepcopy(mtq.NVFP4_DEFAULT_CFG), lambda m: [m(input_ids=ids) for ids in prompts])
    for name, module in model.named_modules():
        quantizer = getattr(module, "input_quantizer", None)
        if quantizer is not None and quantizer.is_enabled and name in amax:
            quantizer._amax_for_smoothing = amax[name]
            apply_pre_quant_scale_and_smooth(module, amax[name].clamp(min=1e-3).sqrt())
    out_dir = Path(out_dir)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Skipping pattern fuse prequant")  # o_proj under GQA, as documented above
        export_hf_checkpoint(model, export_dir=out_dir)
    return out_dir
