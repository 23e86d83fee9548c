"""Which modules a ModelOpt export quantizes with one shared global scale: the producer's rule, not a runtime's.

ModelOpt 0.47's unified HF export (modelopt/torch/export/unified_export_hf.py `requantize_resmooth_fused_llm_layers`:
`collect_shared_input_modules`, then `_fuse_shared_input_modules`, then quant_utils.py `preprocess_linear_fusion`)
runs one dummy forward, groups the quantized linears that receive the same input tensor, and gives each group the
max of its weight amax, so NVFP4 siblings share one weight_scale_2. It skips groups of FP8 per-tensor (QUANTIZATION_FP8,
QUANTIZATION_FP8_PB_REAL): those keep their own weight_scale (measured on its FP8_DEFAULT_CFG export of a tiny Llama:
q/k/v scales differ). The groups below are the ones its own code forms on tiny transformers models, as paths under
their common parent (asked of ModelOpt in tests/test_modelopt_shared_inputs.py): Llama's q/k/v and gate/up,
DeepSeek-V3's q_a_proj / kv_a_proj_with_mqa (q_proj / kv_a_proj_with_mqa without q_lora) and its shared experts'
gate/up; the Gemma 4 assistant's post_projection and masked_embedding.centroids read one hidden state
(tools/modelopt_export.py). Cross-attention's q/k/v read different inputs, hence the `self_attn` parent.
"""

from __future__ import annotations

SHARED_INPUT = (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
                ("self_attn.q_proj", "self_attn.kv_a_proj_with_mqa"),
                ("mlp.gate_proj", "mlp.up_proj"),
                ("shared_experts.gate_proj", "shared_experts.up_proj"),
                ("post_projection", "masked_embedding.centroids"))
OWN_SCALE_ALGORITHMS = frozenset({"FP8"})  # ModelOpt fuses no FP8 per-tensor group


def shared_scale_siblings(module: str, names, algorithm: str) -> list[str]:
    """The module and the stored modules (`names`) ModelOpt's export gives one global scale with it (itself first)."""
    out = [module]
    if algorithm in OWN_SCALE_ALGORITHMS:
        return out
    for group in SHARED_INPUT:
        for member in group:
            if module == member or module.endswith("." + member):
                base = module[: -len(member)]
                out += [base + g for g in group if base + g not in out and base + g in names]
    return out
