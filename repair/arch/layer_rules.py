"""Modules a runtime release builds in some decoder layers only, as the profile's rules over config.json's fields.

The generator (tools/vllm_layer_facts.py) records, per architecture, checkpoint module patterns vLLM's own
load_weights drops in the first or the last `config[field]` layers of the stack (Gemma 3n's KV-shared layers have no
k_proj/v_proj/k_norm in vLLM 0.30+: the last `num_kv_shared_layers`). Here a rule becomes the module names it drops
for one config.json: hostile values (not a whole number between 0 and the stack's depth) drop nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

MOST_LAYERS = 1 << 16  # a decoder deeper than this is not read


@dataclass(frozen=True)
class LayerDrop:
    """`module` (a checkpoint name pattern, `*` = the layer) is dropped in the `run` ("first" | "last") config[field]
    layers of its stack; `source` cites the profile that says so."""

    module: str
    run: str
    field: str
    source: str


def text_part(config: dict | None) -> dict:
    """The config part describing the decoder layers: a VLM's text_config, else the config (hostile: {} if not a dict)."""
    text = config.get("text_config") if isinstance(config, dict) else None
    part = text if isinstance(text, dict) else config
    return part if isinstance(part, dict) else {}


def decoder_depth(config: dict | None) -> int:
    """config.json's num_hidden_layers (a VLM's text model's), or 0."""
    count = text_part(config).get("num_hidden_layers")
    return count if type(count) is int and 0 < count <= MOST_LAYERS else 0


def dropped_modules(rules: tuple[LayerDrop, ...], config: dict | None) -> frozenset[str]:
    """Every checkpoint module name the rules drop for this config."""
    depth, part = decoder_depth(config), text_part(config)
    out: set[str] = set()
    for rule in rules:
        count = part.get(rule.field)
        if type(count) is not int or not 0 <= count <= depth or rule.module.count("*") != 1:
            continue
        layers = range(count) if rule.run == "first" else range(depth - count, depth) if rule.run == "last" else ()
        out.update(rule.module.replace("*", str(layer)) for layer in layers)
    return frozenset(out)
