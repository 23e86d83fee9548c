"""Hand knowledge no generated profile covers yet (repair/arch/profiled.py covers routers and fused layers).

- Qwen3.5 / Qwen3.6 multimodal classes (*ForConditionalGeneration, the published checkpoints' architecture): the
  profile covers vLLM's text-generation registry, where only the text-only Qwen3_5(Moe)ForCausalLM are (their rows,
  MTP drafter included, are generated); this row says what vLLM's source says for the multimodal ones
  (tests/vllm/test_qwen3_5_row_vs_vllm.py reads that source to check it).
"""

from __future__ import annotations

from repair.arch.base import Architecture
from repair.arch.roles import GENERIC_ROLES, UnquantizedRole

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
    "Qwen3.5 / Qwen3.6", architectures=("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration"),
    unquantized_roles=QWEN_NEXT_ROLES,
    # Qwen3_5ForCausalLMBase / Qwen3_5ForConditionalGeneration.packed_modules_mapping: Llama's plus the gated-delta-net pairs
    fused_layers={"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj"),
                  "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")},
)
"""vLLM 0.32 models/qwen3_5.py (dense and MoE, text-only and multimodal): identity names for exclusions (vLLM maps
the patterns with the same hf_to_vllm_mapper); the linear-attention projections in_proj_qkv + in_proj_z and
in_proj_b + in_proj_a are loaded into one layer each, so each pair must share one precision."""
