"""transformers' tensor-parallel plans: for architectures without a loader profile, how their layers split.

Rows are data: a new family's `base_model_tp_plan` is one more entry in TRANSFORMERS_TP_PLANS.
"""

from __future__ import annotations

# transformers' tensor-parallel style names -> our styles. Anything not listed (expert styles, unknown
# names) is replicated, and the TP plan says so.
TRANSFORMERS_TP_STYLES: dict[str, str] = {
    "colwise": "column", "colwise_rep": "column", "colwise_gather_output": "column", "local_colwise": "column",
    "rowwise": "row", "rowwise_rep": "row", "local_rowwise": "row",
    "replicated_with_grad_allreduce": "replicated", "sequence_parallel": "replicated", "gather": "replicated",
}

# transformers' `base_model_tp_plan` by model_type (research gemma4_assistant.md §5), used when
# config.json does not carry its own; keys match module names below the base model (`model.`).
TRANSFORMERS_TP_PLANS: dict[str, dict[str, str]] = {
    "gemma4_text": {
        "layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise", "layers.*.self_attn.v_proj": "colwise",
        "layers.*.self_attn.q_norm": "replicated_with_grad_allreduce", "layers.*.self_attn.k_norm": "replicated_with_grad_allreduce",
        "layers.*.self_attn.o_proj": "rowwise", "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
        "layers.*.mlp.down_proj": "rowwise",
    },
}
