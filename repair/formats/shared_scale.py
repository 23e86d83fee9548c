"""Which modules a ModelOpt export quantizes with one shared global scale: the producer's rule, not a runtime's.

ModelOpt 0.47's unified HF export (modelopt/torch/export/unified_export_hf.py `requantize_resmooth_fused_llm_layers`:
`collect_shared_input_modules`, then `_fuse_shared_input_modules`, then quant_utils.py `preprocess_linear_fusion`)
runs one dummy forward, groups the quantized linears that receive the same input tensor, and gives each group the
max of its weight amax, so NVFP4 siblings share one weight_scale_2. It skips groups of FP8 per-tensor (QUANTIZATION_FP8,
QUANTIZATION_FP8_PB_REAL): those keep their own weight_scale (measured on its FP8_DEFAULT_CFG export of a tiny Llama:
q/k/v scales differ). The groups below are the ones its own code forms on tiny transformers models, as paths under
their common parent (asked of ModelOpt in tests/test_modelopt_shared_inputs.py): q/k/v; an MLP's gate/up whatever
its parent is called (Llama's mlp, DeepSeek-V3's shared_experts, Qwen2-MoE's shared_expert, Llama 4's feed_forward);
DeepSeek-V3's q_a_proj / kv_a_proj_with_mqa (q_proj / kv_a_proj_with_mqa without q_lora); the Gemma 4 assistant's
post_projection and masked_embedding.centroids, which read one hidden state (tools/modelopt_export.py). Cross-attention's
q/k/v read different inputs, hence the `self_attn` parent. Routed experts (experts.N) share one scale per expert's
gate/up, or w1/w3 (Mixtral): ModelOpt exports transformers' fused gate_up_proj through one weight quantizer, and its
layer_utils.py `sync_moe_gate_up_amax` (`_GATE_UP_PAIRS`) gives unfused experts' pairs the max amax.
"""

from __future__ import annotations

SHARED_INPUT = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
                ("self_attn.q_proj", "self_attn.kv_a_proj_with_mqa"),
                ("gate_proj", "up_proj"),
                ("post_projection", "masked_embedding.centroids"))
EXPERT_PAIRS = (("w1", "w3"),)  # under a routed expert (experts.N) only: elsewhere w1/w3 name other layers
OWN_SCALE_ALGORITHMS = frozenset({"FP8"})  # ModelOpt fuses no FP8 per-tensor group


def _routed_expert(base: str) -> bool:
    """`base` (a module's parent, with its trailing dot) is one routed expert, `...experts.N.`."""
    parts = base.split(".")
    return len(parts) >= 3 and parts[-3] == "experts" and parts[-2].isdigit()


def shared_scale_siblings(module: str, names, algorithm: str) -> list[str]:
    """The module and the stored modules (`names`) ModelOpt's export gives one global scale with it (itself first)."""
    out = [module]
    if algorithm in OWN_SCALE_ALGORITHMS:
        return out
    for group in SHARED_INPUT + EXPERT_PAIRS:
        for member in group:
            if module == member or module.endswith("." + member):
                base = module[: -len(member)]
                if group in EXPERT_PAIRS and not _routed_expert(base):
                    continue
                out += [base + g for g in group if base + g not in out and base + g in names]
    return out
