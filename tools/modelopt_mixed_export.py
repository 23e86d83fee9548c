"""A real ModelOpt MIXED_PRECISION export of a tiny Llama, made on CPU (nvidia-modelopt 0.47, transformers 5.24).

One `mtq.quantize` with a per-pattern quant_cfg (ModelOpt picks each Linear's format from its quantizers,
`quant_utils.get_quantization_format`), then `export_hf_checkpoint`, which writes `quant_algo: MIXED_PRECISION`
and `quantized_layers` itself (`quant_utils.process_layer_quant_config`: more than one format -> MIXED_PRECISION)
and config.json's `config_groups` grouped by algorithm (`convert_hf_config.py`). Nothing is edited after export.

Layout (``MIXED_LLAMA``: 3 layers, hidden 64, intermediate 128, 4 heads / 2 KV heads of 16):
  every self_attn q/k/v/o_proj            FP8 per-tensor (FP8_DEFAULT_CFG's quantizers)
  model.layers.0.mlp.*                    NVFP4 (NVFP4_DEFAULT_CFG's quantizers)
  model.layers.1.mlp.*                    W4A16_NVFP4 (NVFP4 weight quantizer, input quantizer disabled);
                                          NVFP4 with w4a16=False
  model.layers.2.mlp.gate_proj, up_proj   NVFP4
  model.layers.2.mlp.down_proj            NVFP4_AWQ (pre_quant_scale kept: a lone Linear, nothing to fuse it into)
  model.layers.2.self_attn.o_proj         excluded (quantizers disabled): BF16, absent from quantized_layers
  lm_head, embeddings                     BF16 (ModelOpt's defaults)
  kv_cache=True adds FP8_KV_CFG's k/v bmm quantizers: k_proj.k_scale / v_proj.v_scale, kv_cache_quant_algo FP8.

Workaround (the same as tools/modelopt_awq_export.py, for the same reason): ModelOpt's AWQ search cannot run on
CPU (its NVFP4 fake-quant forward asserts CUDA), and AWQ configs cannot be given per layer next to other formats in
one quant_cfg anyway (the "algorithm" is model-wide). So the AWQ layer gets what awq_lite does after its search:
the per-input-channel activation amax recorded, then ModelOpt's `apply_pre_quant_scale_and_smooth` with the scale
sqrt(amax) (alpha 0.5, no search). The export then classifies it as nvfp4_awq by its quantizers.
Only down_proj can carry AWQ here: the export fuses the pre_quant_scale of q/k/v and gate/up into the layernorm
(and requires siblings that share an input to share one format).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch

from tools.modelopt_export import TINY_LLAMA, _build_tiny_causal_lm, _modelopt

MIXED_LLAMA: dict[str, Any] = dict(TINY_LLAMA, num_hidden_layers=3)
AWQ_LAYER = "model.layers.2.mlp.down_proj"
EXCLUDED_LAYER = "model.layers.2.self_attn.o_proj"


def build_mixed_llama(seed: int = 0) -> torch.nn.Module:
    """The bf16 model the export quantizes (deterministic per seed): what its dequantization is compared with."""
    return _build_tiny_causal_lm("LlamaConfig", "LlamaForCausalLM", MIXED_LLAMA, seed)


def save_mixed_original(out_dir: Path, seed: int = 0) -> Path:
    out_dir = Path(out_dir)
    build_mixed_llama(seed).save_pretrained(out_dir)
    return out_dir


def _quantizer_cfg(cfg_name: str, kind: str) -> dict:
    """The `cfg` of ModelOpt's `cfg_name` for its '*weight_quantizer' or '*input_quantizer' entry."""
    mtq = _modelopt()[0]
    return next(e["cfg"] for e in getattr(mtq, cfg_name)["quant_cfg"] if e.get("quantizer_name") == f"*{kind}_quantizer")


def mixed_quant_cfg(kv_cache: bool, w4a16: bool = True) -> dict:
    """NVFP4_DEFAULT_CFG with attention switched to FP8_DEFAULT_CFG's quantizers, layer 1's MLP weight-only, the
    excluded layer disabled (later entries win, as in ModelOpt's own configs)."""
    mtq = _modelopt()[0]
    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    base, defaults = cfg["quant_cfg"][:3], cfg["quant_cfg"][3:]  # '*' off, NVFP4 weight/input; then the exclusions
    fp8 = [{"quantizer_name": f"*self_attn.*{kind}_quantizer", "cfg": _quantizer_cfg("FP8_DEFAULT_CFG", kind)}
           for kind in ("weight", "input")]
    weight_only = [{"quantizer_name": "*layers.1.mlp.*input_quantizer", "enable": False}] if w4a16 else []
    extra = weight_only + [{"quantizer_name": f"{EXCLUDED_LAYER}.*", "enable": False}]
    kv = copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"]) if kv_cache else []
    cfg["quant_cfg"] = base + fp8 + extra + kv + defaults
    return cfg


def _activation_amax(model: torch.nn.Module, name: str, prompts: list[torch.Tensor]) -> torch.Tensor:
    """Per-input-channel max |x| of Linear `name` over the prompts (what awq_lite caches before smoothing)."""
    seen: list[torch.Tensor] = []
    hook = model.get_submodule(name).register_forward_hook(
        lambda _m, args, _o: seen.append(args[0].detach().float().abs().reshape(-1, args[0].shape[-1]).amax(0)))
    with torch.no_grad():
        for ids in prompts:
            model(input_ids=ids)
    hook.remove()
    return torch.stack(seen).amax(0)


def export_mixed_llama(out_dir: Path, seed: int = 0, *, kv_cache: bool = True, w4a16: bool = True, awq: bool = True) -> Path:
    """MIXED_PRECISION export (layout in the module docstring), calibrated on 4 seeded 8-token prompts.
    w4a16=False leaves layer 1's MLP NVFP4 (vLLM 0.32 has no CPU kernel for W4A16_NVFP4 linears); awq=False leaves
    AWQ_LAYER NVFP4 (vLLM 0.32 has no linear method for NVFP4_AWQ: it builds the layer unquantized)."""
    mtq, export_hf_checkpoint, _ = _modelopt()
    from modelopt.torch.quantization.model_calib import apply_pre_quant_scale_and_smooth

    model = build_mixed_llama(seed)
    gen = torch.Generator().manual_seed(seed + 3)
    prompts = [torch.randint(0, MIXED_LLAMA["vocab_size"], (1, 8), generator=gen) for _ in range(4)]
    amax = _activation_amax(model, AWQ_LAYER, prompts)
    model = mtq.quantize(model, mixed_quant_cfg(kv_cache, w4a16), lambda m: [m(input_ids=ids) for ids in prompts])
    if awq:
        layer = model.get_submodule(AWQ_LAYER)
        layer.input_quantizer._amax_for_smoothing = amax
        apply_pre_quant_scale_and_smooth(layer, amax.clamp(min=1e-3).sqrt())
    out_dir = Path(out_dir)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To copy construct from a tensor")  # ModelOpt's FP8 scale, as in the oracles
        export_hf_checkpoint(model, export_dir=out_dir)
    return out_dir
