"""Mistral Large 3's config as vLLM reads Mistral's own format (params.json), for tools/vllm_profile_configs.py
(run in .venv-vllm; imports nothing from the repo's ``repair`` package)."""

from __future__ import annotations

# A small params.json in Mistral's own field names (dim, n_layers, hidden_dim, moe.*, ...: the fields vLLM 0.32's
# transformers_utils/configs/mistral.py reads), SMALL's sizes: MLA (qk_nope_head_dim set) and a MoE with a shared expert,
# the shape of Mistral Large 3's params.json (published only in Mistral's format: params.json + consolidated-*.safetensors)
MISTRAL_PARAMS = {
    "dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 4, "head_dim": 16, "hidden_dim": 128, "norm_eps": 1e-6,
    "vocab_size": 256, "rope_theta": 10000.0, "max_position_embeddings": 512, "q_lora_rank": 32, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
    "moe": {"num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 1, "expert_hidden_dim": 32,
            "first_k_dense_replace": 1, "route_every_n": 1, "num_expert_groups": 1, "num_expert_groups_per_tok": 1},
    "llama_4_scaling": {"original_max_position_embeddings": 512, "beta": 0.1},
}


def mistral_format(arch: str) -> tuple[dict, str, dict] | None:
    """The config vLLM's own reader of Mistral's format (mistral.py adapt_config_dict, MistralConfigParser) makes of
    MISTRAL_PARAMS, where it names `arch` (MistralLarge3ForCausalLM: model_type deepseek_v3, so MLA is built); else
    None. Read with vLLM's defaults instead, Mistral Large 3 built DeepseekAttention's qkv_proj, which none of its
    checkpoints holds (deepseek_v2.py:1279-1293)."""
    import copy

    from vllm.transformers_utils.configs.mistral import adapt_config_dict

    adapted = adapt_config_dict(copy.deepcopy(MISTRAL_PARAMS), {})
    config = {k: v for k, v in adapted.to_diff_dict().items() if k != "transformers_version"}
    if config.pop("architectures", None) != [arch]:
        return None
    config["model_type"] = vars(adapted)["model_type"]  # the adapter's (deepseek_v3); to_dict writes the base class's ""
    return config, "vLLM's own reader of Mistral's params.json (transformers_utils/configs/mistral.py " \
        "adapt_config_dict) on a small one (tools/vllm_mistral_config.py MISTRAL_PARAMS)", {}
