"""Runtime profiles as data: what a runtime release allocates for each Gemma 4 assistant layer.

Adding a runtime or a release is adding a row here, not a code path. Facts (see
docs/ARCHITECTURE.md and the research notes): vLLM 0.21-0.24 build every drafter linear in
BF16 and silently skip tensor names they do not know; from 0.25.0 (commit 7a90eb98a) every
drafter layer follows the draft checkpoint's own quantization config and unknown names raise.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repair.errors import UsageError


@dataclass(frozen=True)
class LayerKind:
    """How a runtime builds one layer role: its tensor-parallel style and class name."""

    style: str  # column | row | merged | vocab | replicated
    runtime_class: str
    fused_name: str | None = None  # gate_proj/up_proj load into gate_up_proj


@dataclass(frozen=True)
class Profile:
    """One runtime release range and how it treats a drafter checkpoint."""

    name: str
    runtime: str  # "vllm" or "bf16"
    min_version: tuple[int, ...] | None  # inclusive
    max_version: tuple[int, ...] | None  # exclusive
    follows_draft_config: bool  # False: every linear is built BF16 whatever the config says
    unknown_tensors: str  # "skip" (silently dropped) or "raise"
    allows_quant_config: bool = True


GEMMA4_ASSISTANT_LAYERS: dict[str, LayerKind] = {
    "pre_projection": LayerKind("column", "ColumnParallelLinear"),
    "post_projection": LayerKind("row", "RowParallelLinear"),
    "q_proj": LayerKind("column", "ColumnParallelLinear"),
    "o_proj": LayerKind("row", "RowParallelLinear"),
    "gate_proj": LayerKind("merged", "MergedColumnParallelLinear", "gate_up_proj"),
    "up_proj": LayerKind("merged", "MergedColumnParallelLinear", "gate_up_proj"),
    "down_proj": LayerKind("row", "RowParallelLinear"),
    "embed": LayerKind("vocab", "VocabParallelEmbedding"),
    "lm_head": LayerKind("vocab", "ParallelLMHead"),
    "centroids": LayerKind("replicated", "ReplicatedLinear"),
    "norm": LayerKind("replicated", "RMSNorm"),
    "scalar": LayerKind("replicated", "buffer"),
    "buffer": LayerKind("replicated", "buffer"),
}

# For architectures without a profile: transformers' tensor-parallel style names -> our styles.
# Anything not listed (expert styles, unknown names) is replicated, and the TP plan says so.
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

PROFILES: tuple[Profile, ...] = (
    Profile("vllm 0.21-0.24", "vllm", (0, 21, 0), (0, 25, 0), follows_draft_config=False, unknown_tensors="skip"),
    Profile("vllm >= 0.25", "vllm", (0, 25, 0), None, follows_draft_config=True, unknown_tensors="raise"),
)
BF16 = Profile("bf16", "bf16", None, None, follows_draft_config=False, unknown_tensors="raise", allows_quant_config=False)
NEWEST_KNOWN = "vllm==0.32.0"


@dataclass(frozen=True)
class Target:
    """A resolved `--target`: the spelling the user gave and the profile that applies."""

    spec: str
    profile: Profile

    @property
    def wants_all_bf16(self) -> bool:
        return not self.profile.follows_draft_config


def resolve(spec: str | None) -> Target:
    """`vllm==X.Y.Z` (any release; newest known by default) or `bf16`."""
    spec = (spec or NEWEST_KNOWN).strip()
    if spec.lower() == "bf16":
        return Target("bf16", BF16)
    match = re.fullmatch(r"vllm\s*==\s*(\d+)\.(\d+)(?:\.(\d+))?\S*", spec)
    if not match:
        raise UsageError(f"--target {spec!r}: expected vllm==X.Y.Z or bf16")
    version = tuple(int(p or 0) for p in match.groups())
    for profile in PROFILES:
        if (profile.min_version is None or version >= profile.min_version) and (
            profile.max_version is None or version < profile.max_version
        ):
            return Target(spec, profile)
    raise UsageError(f"--target {spec}: vLLM before 0.21.0 cannot load Gemma 4 assistants at all; target 0.21.0 or newer")
