"""A real ModelOpt NVFP4 export of a tiny gpt-oss (`GptOssForCausalLM`), made on CPU (nvidia-modelopt 0.47,
transformers 5.24), as tools/modelopt_export.py makes the tiny Llama's: the layout a ModelOpt NVFP4 gpt-oss has.

transformers keeps gpt-oss's experts fused (3-D `mlp.experts.gate_up_proj` [E, hidden, 2*inter], `down_proj`, with
`*_bias` [E, out]); ModelOpt's `_QuantGptOssExperts` quantizes them transposed and writes them fused too, with
underscore leaves: `mlp.experts.gate_up_proj` uint8 [E, hidden/2, 2*inter], `gate_up_proj_weight_scale` float8
[E, hidden/16, 2*inter], `gate_up_proj_weight_scale_2`, `gate_up_proj_input_scale` (and the same for `down_proj`),
the biases BF16. `exclude_modules` lists lm_head, the embedding and the routers. Nothing is edited after export.
vLLM 0.32's gpt_oss.py does not load it (tests/vllm/test_gptoss_modelopt_vs_vllm.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tools.modelopt_export import _build_tiny_causal_lm, _export_causal_lm

TINY_GPT_OSS: dict[str, Any] = dict(
    vocab_size=256, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=128,
    layer_types=["sliding_attention", "full_attention"], sliding_window=32,
)


def export_gpt_oss(out_dir: Path, seed: int = 0) -> Path:
    """NVFP4 export (NVFP4_DEFAULT_CFG, calibrated on 4 seeded prompts) of a tiny random gpt-oss."""
    return _export_causal_lm(_build_tiny_causal_lm("GptOssConfig", "GptOssForCausalLM", TINY_GPT_OSS, seed),
                             Path(out_dir), seed)


if __name__ == "__main__":
    import sys

    print(export_gpt_oss(Path(sys.argv[1])))
