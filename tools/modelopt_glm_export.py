"""A real ModelOpt NVFP4 export of a tiny GLM-4.x MoE (`Glm4MoeForCausalLM`), made on CPU (nvidia-modelopt 0.47,
transformers 5.24), as tools/modelopt_export.py makes the tiny Llama's.

transformers builds GLM-4.x's router as `Glm4MoeTopkRouter`, a module holding a bare `weight` Parameter, not an
`nn.Linear`: ModelOpt neither quantizes it nor lists it in `exclude_modules` (it lists only the Linears whose
quantizers it disabled), so every `model.layers.N.mlp.gate` is stored BF16 and named nowhere in the config, as in
the published GLM-4.x NVFP4 exports. vLLM builds that router as `GateLinear` without a quant config
(models/glm4_moe.py), so it never quantizes it either. Nothing is edited after export.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch

from tools.modelopt_export import _build_tiny_causal_lm, _modelopt

TINY_GLM4_MOE: dict[str, Any] = dict(
    vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
    first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, n_routed_experts=4,
    n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1, max_position_embeddings=128,
    partial_rotary_factor=0.5, use_qk_norm=False, tie_word_embeddings=False,
)


def nvfp4_calibrated(model: torch.nn.Module, vocab: int, seed: int, kv_cache: bool) -> torch.nn.Module:
    """mtq.quantize with NVFP4_DEFAULT_CFG (plus FP8_KV_CFG's k/v quantizers), max calibration on 4 seeded prompts."""
    import copy

    mtq = _modelopt()[0]
    cfg = copy.deepcopy(mtq.NVFP4_DEFAULT_CFG)
    if kv_cache:
        cfg["quant_cfg"] = cfg["quant_cfg"][:3] + copy.deepcopy(mtq.FP8_KV_CFG["quant_cfg"]) + cfg["quant_cfg"][3:]
    gen = torch.Generator().manual_seed(seed + 3)
    prompts = [torch.randint(0, vocab, (1, 8), generator=gen) for _ in range(4)]
    return mtq.quantize(model, cfg, lambda m: [m(input_ids=ids) for ids in prompts])


def export_glm4_moe(out_dir: Path, seed: int = 0, *, kv_cache: bool = True) -> Path:
    """NVFP4 (and an FP8 KV cache) export of a tiny random GLM-4.x MoE."""
    export_hf_checkpoint = _modelopt()[1]
    model = _build_tiny_causal_lm("Glm4MoeConfig", "Glm4MoeForCausalLM", TINY_GLM4_MOE, seed)
    model = nvfp4_calibrated(model, TINY_GLM4_MOE["vocab_size"], seed, kv_cache)
    out_dir = Path(out_dir)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_hf_checkpoint(model, export_dir=out_dir)
    return out_dir


if __name__ == "__main__":
    import sys

    print(export_glm4_moe(Path(sys.argv[1])))
