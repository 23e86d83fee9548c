"""Layer roles the runtime never quantizes, whatever the config declares, and the layers vLLM fuses.

vLLM asks the quantization config for a layer's method only for layers its model class builds with
the config, and the config answers only for the layer classes it handles (ModelOpt: `LinearBase`,
`ParallelLMHead`, routed experts; compressed-tensors: `LinearBase`, routed experts). Everything else
(embeddings, norms, router gates built with `quant_config=None`, plain `nn.Linear`) is built
unquantized, so it is never "declared quantized" and its BF16 storage contradicts nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repair.io.regex_index import PatternIndex, searched


@dataclass(frozen=True)
class UnquantizedRole:
    """A layer role vLLM builds unquantized: which modules (re.search on the checkpoint name) and why."""

    name: str
    pattern: str
    why: str  # vLLM's reason, naming its file or class
    formats: tuple[str, ...] = ()  # only under these formats (Format.NAME); empty: under every format
    quant_algos: tuple[str, ...] = ()  # only under these checkpoint-wide quant_algos; empty: under any

    def applies(self, fmt: str, quant_algo: str | None = None) -> bool:
        """Whether the role holds under this format and checkpoint-wide quant_algo (its pattern aside)."""
        return (not self.formats or fmt in self.formats) and (not self.quant_algos or quant_algo in self.quant_algos)

    def covers(self, module: str, fmt: str, quant_algo: str | None = None) -> bool:
        return self.applies(fmt, quant_algo) and re.search(self.pattern, module) is not None


def role_index(roles: tuple[UnquantizedRole, ...]) -> PatternIndex:
    """Every role's pattern (re.search) in one index: a module costs one pass, and most match no role."""
    return PatternIndex.build(len(roles), [searched(i, r.pattern) for i, r in enumerate(roles)])


EMBEDDING = UnquantizedRole("embedding", r"(^|\.)(embed_tokens|embeddings?|word_embeddings|wte)$",
                            "vLLM builds a VocabParallelEmbedding, whose quant method its ModelOpt and compressed-tensors "
                            "configs never make quantized (UnquantizedEmbeddingMethod)")
NORM = UnquantizedRole("norm", r"(^|\.)(\w*norm|ln_f)$", "vLLM builds an RMSNorm/LayerNorm, which no quantization config quantizes")
ROTARY = UnquantizedRole("rotary buffer", r"(^|\.)(rotary_emb|inv_freq)(\.|$)", "a rotary-embedding buffer, recomputed by vLLM, never quantized")
CT_LM_HEAD = UnquantizedRole("output head", r"(^|\.)(lm_head|shared_head\.head)$",
                             "vLLM's compressed-tensors get_quant_method quantizes LinearBase layers only, and its "
                             "ParallelLMHead is a VocabParallelEmbedding", formats=("compressed-tensors",))

GENERIC_ROLES: tuple[UnquantizedRole, ...] = (EMBEDDING, NORM, ROTARY, CT_LM_HEAD)

# vLLM's packed_modules_mapping of Llama-style models (llama.py LlamaForCausalLM, and most others): the
# identity default. A fused layer is built once, so its shards must share one precision.
LLAMA_FUSED: dict[str, tuple[str, ...]] = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
