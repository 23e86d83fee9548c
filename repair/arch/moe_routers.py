"""Hand knowledge no generated profile covers yet (repair/arch/profiled.py covers routers and fused layers).

- MTP drafter layers: the profile builds each architecture's main model; DeepSeek's MTP layer (`eh_proj`) is
  built by vLLM's DeepSeekMTP drafter, which the profile does not build.
- Qwen3.5 / Qwen3.6: vLLM 0.32's qwen3_5.py cannot be imported on this CPU host (its multimodal processor needs
  torchvision), so the profile records it as unprofiled; this row says what its source says
  (tests/vllm/test_qwen3_5_row_vs_vllm.py reads that source to check it).
"""

from __future__ import annotations

from repair.arch.base import Architecture
from repair.arch.roles import GENERIC_ROLES, UnquantizedRole

DEEPSEEK_MTP_EH_PROJ = UnquantizedRole("MTP input projection", r"(^|\.)eh_proj$",
                                       "vLLM's DeepSeekMultiTokenPredictorLayer builds eh_proj as a plain torch nn.Linear "
                                       "(models/deepseek_mtp.py), which no quantization config sees")
# (roles, architectures they are added to): vLLM 0.32 models/deepseek_mtp.py (DeepSeekMTP) serves both
DEEPSEEK_MTP = (((DEEPSEEK_MTP_EH_PROJ,), ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")),)

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
