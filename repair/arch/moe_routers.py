"""MoE families whose vLLM model class builds layers the quantization config never sees.

Rows only where the identity default (GENERIC) reads a declaration differently from vLLM 0.32;
their names are the checkpoint's (identity), their fused layers vLLM's `packed_modules_mapping`.
"""

from __future__ import annotations

from repair.arch.base import Architecture
from repair.arch.roles import GENERIC_ROLES, UnquantizedRole

ROUTER_WHY = "vLLM's {cls} builds the router as GateLinear(quant_config=None) ({file}), so it is never quantized"
DEEPSEEK_ROUTER = UnquantizedRole("router gate", r"\.mlp\.gate$", ROUTER_WHY.format(cls="DeepseekV2MoE", file="models/deepseek_v2.py"))
DEEPSEEK_MTP_EH_PROJ = UnquantizedRole("MTP input projection", r"(^|\.)eh_proj$",
                                       "vLLM's DeepSeekMultiTokenPredictorLayer builds eh_proj as a plain torch nn.Linear "
                                       "(models/deepseek_mtp.py), which no quantization config sees")

DEEPSEEK_V3 = Architecture(
    "DeepSeek V2/V3/R1", architectures=("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"),
    unquantized_roles=(*GENERIC_ROLES, DEEPSEEK_ROUTER, DEEPSEEK_MTP_EH_PROJ),
    # DeepseekV2ForCausalLM.packed_modules_mapping: gate_up_proj always, fused_qkv_a_proj when q_lora_rank is set,
    # qkv_proj for MHA variants; a group counts only where its shards are stored
    fused_layers={"gate_up_proj": ("gate_proj", "up_proj"), "fused_qkv_a_proj": ("q_a_proj", "kv_a_proj_with_mqa"),
                  "qkv_proj": ("q_proj", "k_proj", "v_proj")},
)
"""vLLM 0.32 models/deepseek_v2.py (DeepseekV2ForCausalLM, DeepseekV2MoE) and models/deepseek_mtp.py (DeepSeekMTP):
identity names (no hf_to_vllm_mapper); routers and the MTP layer's eh_proj are built without the quant config."""

LAGUNA = Architecture(
    "Laguna", architectures=("LagunaForCausalLM",),
    unquantized_roles=(*GENERIC_ROLES, UnquantizedRole("router gate", r"\.mlp\.gate$",
                                                       ROUTER_WHY.format(cls="LagunaMoE", file="models/laguna.py"))),
    fused_layers={"qkv_proj": ("q_proj", "k_proj", "v_proj")},  # LagunaForCausalLM.packed_modules_mapping: no gate_up
)
"""vLLM 0.32 models/laguna.py (LagunaForCausalLM): identity names; the router is built without the quant config,
and its MLPs keep gate_proj and up_proj as separate ColumnParallelLinear layers."""

QWEN_NEXT_ROLES = (
    *GENERIC_ROLES,
    UnquantizedRole("router gate", r"\.mlp\.gate$", "vLLM's Qwen3NextSparseMoeBlock builds the router as GateLinear without "
                    "a quant config (models/qwen3_next.py), so it is never quantized"),
    UnquantizedRole("shared-expert gate", r"\.shared_expert_gate$", "vLLM's Qwen3NextSparseMoeBlock builds shared_expert_gate "
                    "as ReplicatedLinear(quant_config=None) (models/qwen3_next.py)"),
    UnquantizedRole("MTP input projection", r"^mtp\.fc$", "vLLM's Qwen3.5 / Qwen3-Next MTP drafter builds mtp.fc without the "
                    "quant config under a plain NVFP4 (modelopt_fp4) config (models/qwen3_5_mtp.py, qwen3_next_mtp.py)",
                    formats=("modelopt-nvfp4",),
                    # vLLM's modelopt_fp4 is the NVFP4 algorithms; a ModelOpt FP8 checkpoint's config (modelopt) builds mtp.fc FP8
                    quant_algos=("NVFP4", "W4A16_NVFP4", "NVFP4_AWQ")),
)
"""The MoE block (and MTP drafter) Qwen3-Next and Qwen3.5 / Qwen3.6 share in vLLM 0.32."""

QWEN3_NEXT = Architecture(
    "Qwen3-Next", architectures=("Qwen3NextForCausalLM",), unquantized_roles=QWEN_NEXT_ROLES,
    # Qwen3NextForCausalLM.packed_modules_mapping: Llama's; in_proj_qkvz / in_proj_ba are stored fused already
)

QWEN3_5 = Architecture(
    "Qwen3.5 / Qwen3.6", architectures=("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                                        "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"),
    unquantized_roles=QWEN_NEXT_ROLES,
    # Qwen3_5ForCausalLMBase / Qwen3_5ForConditionalGeneration.packed_modules_mapping: Llama's plus the gated-delta-net pairs
    fused_layers={"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
                  "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")},
)
"""vLLM 0.32 models/qwen3_5.py (dense and MoE, text-only and multimodal): identity names for exclusions (vLLM maps
the patterns with the same hf_to_vllm_mapper); the linear-attention projections in_proj_qkv + in_proj_z and
in_proj_b + in_proj_a are loaded into one layer each, so each pair must share one precision."""
