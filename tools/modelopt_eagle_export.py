"""A real ModelOpt EAGLE-3 draft export of a tiny Llama, made on CPU (nvidia-modelopt 0.47, transformers 5.24).

ModelOpt's speculative-decoding path, as its examples run it: `mtsp.convert(model, [("eagle", EAGLE3 config)])`,
`mtq.quantize` (NVFP4_DEFAULT_CFG, plus FP8_KV_CFG's k/v quantizers when kv_cache=True), then
`export_speculative_decoding`, whose `EagleExporter.export` writes the draft only: config.json from ModelOpt's
`llama_eagle_template_config` (architectures ["LlamaForCausalLMEagle3"]) with `quantization_config` set to the raw
`{"producer": ..., "quantization": {...}}` block, the same dict as hf_quant_config.json, and the draft's tensors
(`layers.0.*`, `fc`, `norm`, `lm_head`; no `model.` prefix). Nothing is edited after export.

One shim, compatibility only: ModelOpt 0.47's EAGLE module builds its rotary embedding lazily with
`LlamaRotaryEmbedding(config=..., device=...)`, which transformers 5.24 no longer accepts; the module's
`rotary_emb` is set beforehand with the same class and config (the value ModelOpt would build), so the lazy path
is skipped.
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

import torch

from tools.modelopt_export import TINY_LLAMA, _build_tiny_causal_lm
from tools.modelopt_glm_export import nvfp4_calibrated

DRAFT_DIMS: dict[str, Any] = {"hidden_size": TINY_LLAMA["hidden_size"], "intermediate_size": TINY_LLAMA["intermediate_size"],
                              "num_attention_heads": TINY_LLAMA["num_attention_heads"],
                              "num_key_value_heads": TINY_LLAMA["num_key_value_heads"], "head_dim": TINY_LLAMA["hidden_size"] // TINY_LLAMA["num_attention_heads"],
                              "draft_vocab_size": TINY_LLAMA["vocab_size"], "vocab_size": TINY_LLAMA["vocab_size"],
                              "max_position_embeddings": 128}


def export_eagle3_draft(out_dir: Path, seed: int = 0, *, kv_cache: bool = True) -> Path:
    """The EAGLE-3 draft of a tiny random Llama, NVFP4 (and an FP8 KV cache), calibrated on 4 seeded prompts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import modelopt.torch.speculative as mtsp
        from modelopt.torch.export.unified_export_hf import export_speculative_decoding
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    model = _build_tiny_causal_lm("LlamaConfig", "LlamaForCausalLM", TINY_LLAMA, seed)
    eagle = copy.deepcopy(mtsp.config.EAGLE3_DEFAULT_CFG["config"])
    eagle["eagle_architecture_config"].update(DRAFT_DIMS)
    mtsp.convert(model, [("eagle", eagle)])
    model.eagle_module.rotary_emb = LlamaRotaryEmbedding(config=model.eagle_module.config)
    model = nvfp4_calibrated(model, TINY_LLAMA["vocab_size"], seed, kv_cache)
    out_dir = Path(out_dir)
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export_speculative_decoding(model, dtype=torch.bfloat16, export_dir=out_dir)
    return out_dir


if __name__ == "__main__":
    import sys

    print(export_eagle3_draft(Path(sys.argv[1])))
