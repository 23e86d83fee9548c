"""Per-architecture values a small config sets that transformers' config class does not (run in .venv-vllm).

Published configs carry these attributes and vLLM's model file reads them; each value is the one vLLM's own code path
takes by default (provenance: the vLLM 0.32 file named beside it). Read by tools/vllm_profile_configs.py.
Imports nothing from the repo's ``repair`` package.
"""

from __future__ import annotations

# DeepSeek-V4's published rope_parameters (tests/data/real/redhatai-deepseek-v4-flash-nvfp4-fp8/config.json), its
# original positions shrunk so that factor * them is SMALL's max_position_embeddings
DSV4_ROPE = {"beta_fast": 32, "beta_slow": 1, "factor": 16, "original_max_position_embeddings": 32,
             "partial_rotary_factor": 0.125, "rope_theta": 10000, "rope_type": "yarn", "type": "yarn"}
# Attributes vLLM's model file reads that transformers' config class does not define (published configs carry them);
# each value is the one named in vLLM's own code path for the default case. Provenance: the vLLM 0.32 file named.
EXTRA: dict[str, dict] = {
    "Glm4MoeLiteForCausalLM": {"first_k_dense_replace": 1},  # models/glm4_moe_lite.py
    "MiniMaxM2ForCausalLM": {"rotary_dim": 8, "scoring_func": "sigmoid"},  # models/minimax_m2.py
    "AfmoeForCausalLM": {"score_func": "sigmoid", "route_norm": True, "n_group": 1, "topk_group": 1},  # models/afmoe.py
    "Mamba2ForCausalLM": {"num_heads": 8, "n_groups": 1},  # transformers: hidden_size * expand == num_heads * head_dim
    "Lfm2ForCausalLM": {"block_dim": 64, "block_ff_dim": 128, "block_multiple_of": 16, "block_auto_adjust_ff_dim": False,
                        "block_ffn_dim_multiplier": 1.0},  # models/lfm2.py reads the block_* fields of Liquid's configs
    "LongcatFlashForCausalLM": {"mla_scale_q_lora": False, "mla_scale_kv_lora": False, "zero_expert_num": 0,
                                "zero_expert_type": "identity"},  # models/longcat_flash.py
    "HYV3ForCausalLM": {"first_k_dense_replace": 1, "expert_hidden_dim": 32, "route_norm": True},  # models/hy_v3.py
    # models/dbrx.py reads attn_config.rope_theta (published DBRX configs hold it there; transformers 5 moved it)
    "DbrxForCausalLM": {"d_model": 64, "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
                        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}},
    "Lfm2MoeForCausalLM": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},  # models/lfm2_moe.py
    # models/mimo_v2.py reads the published config's hybrid_layer_pattern (1 = sliding-window layer) and SWA sizes
    "MiMoV2FlashForCausalLM": {"hybrid_layer_pattern": [0, 1], "moe_layer_freq": [0, 1], "swa_num_attention_heads": 4,
                               "swa_num_key_value_heads": 2, "swa_head_dim": 16, "sliding_window_size": 64,
                               "layernorm_epsilon": 1e-6, "attention_bias": False},
    # Nemotron-H 8B/47B's layer kinds (mamba, attention, MLP: their hybrid_override_pattern has no MoE "E"); vLLM
    # builds the relu2 non-gated MoE of Nemotron 3 only on CUDA/ROCm/XPU (fused_moe/config.py), so those rows are absent
    "NemotronHForCausalLM": {"layers_block_type": ["linear_attention", "full_attention", "mlp"], "mamba_num_heads": 8,
                             "mamba_head_dim": 16, "n_groups": 1, "ssm_state_size": 16},
    # models/kimi_linear.py; mla_use_nope as published (moonshotai/Kimi-Linear-48B-A3B-Instruct config.json: true; vLLM's
    # own KimiLinearConfig defaults it False and transformers' class has no such field): vLLM 0.28's GPU class
    # (models/kimi_k3/nvidia/model.py:891) asserts it, so a config without it judged every Kimi-Linear refused
    # Its layers as published too: vLLM 0.28/0.30's KimiLinearConfig reads linear_attn_config (1-based kda_layers /
    # full_attn_layers, None: every layer MLA) and first_k_dense_replace (default 0: every layer MoE), which transformers'
    # class does not write (its layer_types / mlp_layer_types: SMALL's 3 layers, linear, linear, full; dense, sparse, sparse)
    "KimiLinearForCausalLM": {"num_experts_per_token": 2, "linear_head_dim": 16, "linear_num_heads": 4,
                              "num_attention_heads": 4, "num_key_value_heads": 4, "mla_use_nope": True,
                              "first_k_dense_replace": 1, "moe_layer_freq": 1,
                              "linear_attn_config": {"kda_layers": [1, 2], "full_attn_layers": [3], "num_heads": 4,
                                                     "head_dim": 16, "short_conv_kernel_size": 4}},
    # transformers' class builds a QSA indexer in every attention layer (modeling_qwen4_exp.py:837) from the indexer_*
    # fields, which its config leaves None, and validates them together (kv heads 1, budget a multiple of the ratio):
    # every checkpoint it writes has them. vLLM reads indexer_n_heads to choose QSA attention (qwen4_exp/nvidia/
    # model.py:243, amd/model.py:217) and the rest in indexer_qsa.py:115-119 (amd: 99-103); it builds that attention
    # on CPU with tools/vllm_runtime.py's flash_attention_stand_in. Small values; no published config here, but
    # budget / ratio = 512, the smaller of the two values vLLM 0.30 accepts (models/qwen4_exp/config.py:152; 0.32 has no
    # such check), so 0.30 is judged on what it refuses in a config transformers writes (layer type indexed_attention)
    # output_gate_type: silu | swish | sigmoid (models/qwen4_exp)
    "Qwen4ExpForCausalLM": {"output_gate_type": "sigmoid", "indexer_n_heads": 4, "indexer_kv_heads": 1,
                            "indexer_head_dim": 16, "indexer_budget": 2048, "indexer_compress_ratio": 4},
    # the MTP layer count published Qwen3.5 / Qwen3-Next configs carry (vLLM's config/speculative.py reads it)
    "Qwen3_5ForCausalLM": {"mtp_num_hidden_layers": 1}, "Qwen3_5MoeForCausalLM": {"mtp_num_hidden_layers": 1},
    "Qwen3NextForCausalLM": {"num_nextn_predict_layers": 1},
    # vllm/models/inkling/nvidia/model.py reads these fields of the published config
    "InklingForCausalLM": {"padded_vocab_size": 256, "use_embed_norm": False, "dense_mlp_idx": 0,
                           "use_global_scale": False, "sconv_kernel_size": 4,
                           "logits_mup_width_multiplier": 1.0, "final_logit_softcapping": None, "local_layer_ids": [0],
                           "q_bias": False, "o_bias": False, "gate_activation": "sigmoid", "norm_after_topk": True,
                           "inference_moe_w13_interleaved": True, "use_gate_bias": True},  # moe.py asserts these
    # transformers' Inkling vision tower takes its widths from the patch (modeling_inkling.py plan_out_scales), not
    # hidden_size, and maps num_hidden_layers to n_layers: the shrunk config kept 24 layers of 40x40 patches (GBs to
    # build); 4x4 patches over 4 layers (no fewer than its scales, where it would ask scipy) are a few KB
    "InklingForConditionalGeneration": {"vision_config.patch_size": 4, "vision_config.n_layers": 4,
                                        "vision_config.hidden_size": 32, "vision_config.num_attention_heads": 2},
    # gemma4.py:630 builds the MoE block when num_experts is set (the text defaults set it), transformers' class only
    # with enable_moe_block (as Gemma4ForCausalLM's PUBLISHED): both build it, as published Gemma 4 MoE configs do
    "Gemma4ForConditionalGeneration": {"text_config.enable_moe_block": True},
    "Zamba2ForCausalLM": {"head_dim": 32, "attention_head_dim": 32},  # models/zamba2.py: head_dim * heads == 2 * hidden_size
    # published DeepSeek-V4 configs give the per-layer kinds as `compress_ratios` (0 / 4 / 128, one per layer) and
    # `num_hash_layers` (tests/data/real/redhatai-deepseek-v4-flash-nvfp4-fp8/config.json): what vLLM reads
    # (models/deepseek_v4/attention.py:233, nvidia/model.py:1088); transformers folds them into layer_types /
    # mlp_layer_types (configuration_deepseek_v4.py:236-268), which vLLM's own DeepseekV4Config
    # (transformers_utils/configs/deepseek_v4.py) hands to transformers' generic validator (configuration_utils.py:577),
    # refusing "hash_moe": so the small config is written in the published form, one layer of each attention kind.
    # Head sizes: the published ones, the only ones vLLM's compressor takes (deepseek_v4/compressor.py:295-313).
    # RoPE as published too: one flat rope_parameters and compress_rope_parameters (yarn; positions shrunk), not
    # transformers' {"main", "compress"} nesting, which only vLLM 0.32's rope.py unpacks (0.28's get_rope raises
    # `unhashable type: 'dict'` on it: models/deepseek_v4/common/rope.py, rotary_embedding/__init__.py:83)
    "DeepseekV4ForCausalLM": {"layer_types": None, "mlp_layer_types": None, "num_hidden_layers": 3,
                              "compress_ratios": [0, 4, 128], "num_hash_layers": 1, "head_dim": 512,
                              "qk_rope_head_dim": 64, "index_head_dim": 128,
                              "rope_parameters": DSV4_ROPE, "compress_rope_parameters": {**DSV4_ROPE, "rope_theta": 160000}},
    # vLLM's own config classes (vllm_config_class). chatglm.py:107 reads original_rope and :409 tie_word_embeddings,
    # which ChatGLMConfig does not set (published GLM-4 configs: true, false)
    **{a: {"original_rope": True, "tie_word_embeddings": False} for a in ("ChatGLMModel", "ChatGLMForConditionalGeneration")},
    # step3_text.py:249-251 and step3p5.py:470-472 read moe_layers_enum as the published configs hold it, a comma string
    # (Step3TextConfig's default is a tuple); one dense layer, one MoE layer. Sizes vLLM reads the class does not shrink
    "Step3TextForCausalLM": {"moe_layers_enum": "1", "moe_top_k": 2, "share_expert_dim": 32, "share_q_dim": 32},
    "Step3p5ForCausalLM": {"num_attention_groups": 2, "moe_top_k": 2, "share_expert_dim": 32},
    # transformers derives mlp_layer_types from first_k_dense_replace (configuration_deepseek_v32.py:133-136,
    # configuration_glm_moe_dsa.py:153-156), vLLM reads first_k_dense_replace alone (models/deepseek_v2.py:1295): the
    # class's default list cut to its kinds would make layer 1 dense in transformers and MoE in vLLM
    **{a: {"first_k_dense_replace": 1, "mlp_layer_types": ["dense", "sparse"]}
       for a in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")},
}
