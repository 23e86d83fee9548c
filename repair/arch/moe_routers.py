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
