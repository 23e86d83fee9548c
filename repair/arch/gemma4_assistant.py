"""Gemma 4 assistant (MTP drafter) checkpoints: the full-precision shape of every module.

Covers `gemma4_assistant` (E2B, E4B, 26B-A4B, 31B) and `gemma4_unified_assistant` (12B).
Shapes come from config.json read as raw JSON: newer transformers move the full-attention
head size into `text_config.per_layer_config`, older ones write a flat `global_head_dim`;
both are understood. The family keeps the handshake layers `pre_projection` ([H, 2B]) and
`post_projection` ([B, H]) in BF16.
"""

from __future__ import annotations

from repair.arch.base import Architecture, LayerKind, ModuleSpec
from repair.errors import BadInput

MODEL_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")
BF16_HANDSHAKE = ("pre_projection", "post_projection")
DEFAULT_GLOBAL_HEAD_DIM = 512  # transformers' Gemma4TextConfig default
MAX_LAYERS = 4096
FUSED_SHARDS = {"gate_up_proj": ("gate_proj", "up_proj")}

LAYER_KINDS: dict[str, LayerKind] = {  # how vLLM's Gemma4MTP builds each role
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


def draft_prefix(module: str) -> str:
    """The quantization prefix vLLM gives a Gemma 4 assistant module (checkpoint name in): layers are matched
    under `draft_model.` prefixes, and gate/up under their fused `gate_up_proj` name."""
    if module.startswith("model."):
        module = "draft_model." + module[len("model."):]
    elif module in ("pre_projection", "post_projection"):
        module = "draft_model." + module
    for fused, shards in FUSED_SHARDS.items():
        for shard in shards:
            if module.endswith("." + shard):
                return module[: -len(shard)] + fused
    return module


def exclusion_name(module: str) -> str:
    """The entry that excludes a module: a drafter's gate/up only by the fused `gate_up_proj` name."""
    for shard in (".mlp.gate_proj", ".mlp.up_proj"):
        if module.endswith(shard):
            return module[: -len(shard)] + ".mlp.gate_up_proj"
    return module




def expected_modules(config: dict, where: str = "config.json") -> dict[str, ModuleSpec]:
    """Every module this config defines (weights by module name, other tensors by tensor name)."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        raise BadInput(f"{where}: a {config.get('model_type')} config needs a text_config object; fix the config")
    hidden = _int(text, "hidden_size", where)
    backbone = _int(config, "backbone_hidden_size", where)
    inter = _int(text, "intermediate_size", where)
    layers = _int(text, "num_hidden_layers", where)
    heads = _int(text, "num_attention_heads", where)
    vocab = _int(text, "vocab_size", where)
    if layers > MAX_LAYERS:
        raise BadInput(f"{where}: num_hidden_layers {layers} is not plausible for an assistant (at most {MAX_LAYERS}); fix the config")
    specs = [
        ModuleSpec("model.embed_tokens", (vocab, hidden), "embed"),
        ModuleSpec("pre_projection", (hidden, 2 * backbone), "pre_projection"),
        ModuleSpec("post_projection", (backbone, hidden), "post_projection"),
        ModuleSpec("model.norm", (hidden,), "norm"),
    ]
    for layer in range(layers):
        specs.extend(_layer(text, layer, hidden, inter, heads, where))
    if not config.get("tie_word_embeddings", True):
        specs.append(ModuleSpec("lm_head", (vocab, hidden), "lm_head"))
    if config.get("use_ordered_embeddings"):
        centroids = _int(config, "num_centroids", where)
        specs.append(ModuleSpec("masked_embedding.centroids", (centroids, hidden), "centroids"))
        specs.append(ModuleSpec("masked_embedding.token_ordering", (vocab,), "buffer"))
    return {s.name: s for s in specs}


def _layer(text: dict, layer: int, hidden: int, inter: int, heads: int, where: str) -> list[ModuleSpec]:
    p = f"model.layers.{layer}"
    head_dim = head_dim_of(text, layer, where)
    specs = [
        ModuleSpec(f"{p}.self_attn.q_proj", (heads * head_dim, hidden), "q_proj"),
        ModuleSpec(f"{p}.self_attn.o_proj", (hidden, heads * head_dim), "o_proj"),
        ModuleSpec(f"{p}.self_attn.q_norm", (head_dim,), "norm"),
        ModuleSpec(f"{p}.mlp.gate_proj", (inter, hidden), "gate_proj"),
        ModuleSpec(f"{p}.mlp.up_proj", (inter, hidden), "up_proj"),
        ModuleSpec(f"{p}.mlp.down_proj", (hidden, inter), "down_proj"),
        ModuleSpec(f"{p}.layer_scalar", (1,), "scalar"),
    ]
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm"):
        specs.append(ModuleSpec(f"{p}.{norm}", (hidden,), "norm"))
    return specs


def head_dim_of(text: dict, layer: int, where: str) -> int:
    """Query head size of one layer: per_layer_config wins, then global_head_dim for full attention."""
    try:
        value = _head_dim(text, layer, where)
    except (AttributeError, KeyError, TypeError, ValueError):
        raise BadInput(f"{where}: text_config.per_layer_config / layer_types / global_head_dim are malformed for layer {layer}; fix the config") from None
    if type(value) is not int or value <= 0:
        raise BadInput(f"{where}: head size {value!r} of layer {layer} must be a positive integer; fix the config")
    return value


def _head_dim(text: dict, layer: int, where: str) -> int:
    per_layer = (text.get("per_layer_config") or {}).get(str(layer)) or {}
    if not isinstance(per_layer, dict):
        raise TypeError("per_layer_config entries are objects")
    if "head_dim" in per_layer:
        return per_layer["head_dim"]
    layer_types = text.get("layer_types") or []
    is_full = layer < len(layer_types) and layer_types[layer] == "full_attention"
    if is_full and not text.get("per_layer_config"):
        return text.get("global_head_dim") or DEFAULT_GLOBAL_HEAD_DIM
    return _int(text, "head_dim", where)


def _int(section: dict, key: str, where: str) -> int:
    value = section.get(key)
    if type(value) is not int or value <= 0:
        raise BadInput(f"{where}: '{key}' must be a positive integer, found {value!r}; fix the config")
    return value


GEMMA4_ASSISTANT = Architecture("Gemma 4 assistant", model_types=MODEL_TYPES, runtime_name=draft_prefix,
                                exclusion_name=exclusion_name, expected_modules=expected_modules,
                                layer_kinds=LAYER_KINDS, bf16_handshake=BF16_HANDSHAKE,
                                # Gemma4MTP has no packed_modules_mapping (no fused-shard exclusion rule), but its
                                # Gemma4MLP builds gate/up as one MergedColumnParallelLinear (gemma4_mtp.py's mapper:
                                # orig_to_new_stacked .gate_proj/.up_proj -> .gate_up_proj), one weight_scale_2
                                fused_layers={}, merged_layers={"gate_up_proj": ("gate_proj", "up_proj")})
