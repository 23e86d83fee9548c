"""Modules a runtime release builds in some decoder layers only, as the profile's rules over config.json's fields.

The generator (tools/vllm_layer_facts.py) records, per architecture, checkpoint module patterns vLLM's own
load_weights drops in the first or the last `config[field]` layers of the stack (Gemma 3n's KV-shared layers have no
k_proj/v_proj/k_norm in vLLM 0.30+: the last `num_kv_shared_layers`). Here a rule becomes the module names it drops
for one config.json: hostile values (not a whole number between 0 and the stack's depth) drop nothing. A rule may
also name a per-layer list of config.json (`where`): vLLM 0.32 builds DeepSeek-V4's attention compressor in no layer
whose `compress_ratios[i]` is 0, its indexer in none whose entry is 0 or 128; a list shorter than the stack drops
nothing, entries past it are not read (both runtimes index it by layer number). A `where` rule may name lists of layer numbers (`unless_listed`) in whose common layers it keeps the
module: SGLang 0.5.23 builds DeepSeek-V4.1's ratio-1/2 compressor only in the layers `kv_source_layer_ids` lists, its
indexer's keys only in those both it and `index_source_layer_ids` list (a list that is not whole numbers drops
nothing). A module may have several rules, each dropping its own layers.
"""

from __future__ import annotations

from dataclasses import dataclass

MOST_LAYERS = 1 << 16  # a decoder deeper than this is not read


@dataclass(frozen=True)
class LayerDrop:
    """`module` (a checkpoint name pattern, `*` = the layer) is dropped in the `run` ("first" | "last") config[field]
    layers of its stack, or (`run` "where") in each layer i whose config[field][i] is one of `values`; `source` cites
    the profile that says so."""

    module: str
    run: str
    field: str
    source: str
    values: tuple[int | str, ...] = ()
    unless_listed: tuple[str, ...] = ()  # config.json lists of layer numbers: their common layers keep the module


def layer_drops(module: str, rule: dict | list, source: str) -> tuple[LayerDrop, ...]:
    """A profile's per-layer rule of one module: {"first" | "last": field}, or {"where": list field, "in": values,
    optionally "unless_listed": list field}; or a list of such rules."""
    if isinstance(rule, list):
        return tuple(d for one in rule for d in layer_drops(module, one, source))
    if "where" in rule:
        return (LayerDrop(module, "where", rule["where"], source, tuple(rule["in"]), tuple(rule.get("unless_listed", ()))),)
    return tuple(LayerDrop(module, run, field, source) for run, field in sorted(rule.items()))


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
        if rule.run == "where":
            out.update(rule.module.replace("*", str(i)) for i in _where(rule, part, depth, rule.values))
            continue
        if type(count) is not int or not 0 <= count <= depth or rule.module.count("*") != 1:
            continue
        layers = range(count) if rule.run == "first" else range(depth - count, depth) if rule.run == "last" else ()
        out.update(rule.module.replace("*", str(layer)) for layer in layers)
    return frozenset(out)


def _where(rule: LayerDrop, part: dict, depth: int, values: tuple) -> list[int]:
    """The layers whose entry of the rule's per-layer list is one of `values` (hostile: a list shorter than the stack,
    or a pattern without one `*`, names none; an entry not a whole number or string names no layer)."""
    entries = part.get(rule.field)
    if not isinstance(entries, list) or len(entries) < depth or rule.module.count("*") != 1:
        return []
    lists = [_listed(part.get(field)) for field in rule.unless_listed]
    if None in lists:
        return []
    kept = frozenset.intersection(*lists) if lists else frozenset()
    return [i for i, v in enumerate(entries[:depth]) if type(v) in (int, str) and any(type(v) is type(x) and v == x for x in values)
            and i not in kept]


def _listed(entries: object) -> frozenset[int] | None:
    """The layer numbers a config.json list names (hostile: anything but a list of at most MOST_LAYERS whole numbers,
    bools excluded, names nothing provable: None)."""
    if not isinstance(entries, list) or len(entries) > MOST_LAYERS or any(type(v) is not int for v in entries):
        return None
    return frozenset(entries)
