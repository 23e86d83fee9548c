"""How a fix's exclusion entries are spelled for the runtimes it targets: some releases read a fused layer only by
its own name, some have no `re:` entries (their data's rules say which)."""

from __future__ import annotations

from repair.formats.base import routed_layer


def plain_entries(config: dict | None, plain: dict[str, str]) -> dict | None:
    """config.json's `ignore` with the format's pattern entries written as the module names they stand for."""
    qc = (config or {}).get("quantization_config")
    if isinstance(qc, dict) and isinstance(qc.get("ignore"), list):
        qc["ignore"] = [plain.get(e, e) for e in qc["ignore"]]
    return config


def runtime_names(targets, family, names: list[str]) -> list[str]:
    """The entries that exclude `names` for the recipe's targets: a release that asks a fused layer only by its own
    name (its data's fused policy `fused_name_only`, TensorRT-LLM 1.0) is given the fused name, instead of its shards
    when every target is such a release, besides them when another target reads the shards' names."""
    by_name = [t.profile.rules is not None and t.profile.rules.fused.get("policy") == "fused_name_only" for t in targets]
    if not any(by_name):
        return names
    groups = [(fused, members) for fused, members in family.fused_groups(names)
              if len(members) == len(family.fused_layers[fused.rpartition(".")[2]])]
    taken = {m for _, members in groups for m in members}
    kept = names if not all(by_name) else [n for n in names if n not in taken]
    return sorted(set(kept) | {fused for fused, _ in groups})


def whole_layer_names(targets, config: dict | None, modules, made: set[str], names: list[str], covers) -> list[str]:
    """`names` with a layer named whole once every linear stored under it ends BF16 (`made`, or stored so): each MTP
    layer a target builds from the model's own config (its data's `draft.mtp_layer`, TensorRT-LLM's
    `model.layers.{num_hidden_layers + i}`), and a routed-experts layer (`...mlp.experts`) one of whose per-expert
    entries some target does not read (TensorRT-LLM asks its MoE only by the layer's name). The layer's name replaces
    each entry under it that every target reads it as covering. Experts first: an MTP layer that stays partly
    quantized still gets its experts layer's name."""
    mtp = {layer for t in targets if t.profile.rules is not None for layer in t.profile.rules.mtp_layers(config)}
    first: dict[str, str] = {}  # a routed-experts layer -> one expert entry: targets read all of its experts alike
    for n in names:
        if (routed := routed_layer(n)) != n:
            first.setdefault(routed, n)
    experts = {layer for layer, n in first.items() if not covers([n], n)}
    for layers in (experts, mtp):
        names = _named_whole(layers, modules, made, names, covers) if layers else names
    return names


def _named_whole(layers: set[str], modules, made: set[str], names: list[str], covers) -> list[str]:
    owner = _owners(layers)
    under: dict[str, list[str]] = {}
    for n in names:
        if (layer := owner(n)) is not None:
            under.setdefault(layer, []).append(n)
    kept = {owner(n) for n, m in modules.items() if m.is_quantized and n not in made} - {None}  # stays quantized
    out = set(names)
    for layer in sorted(set(under) - kept):
        out -= {n for n in under[layer] if covers([layer], n)}
        out.add(layer)
    return sorted(out)


def _owners(layers: set[str]):
    """name -> the layer in `layers` it is under (None): one dict lookup per distinct prefix length, not per layer."""
    prefixes = {layer + ".": layer for layer in layers}
    lengths = sorted({len(p) for p in prefixes})
    return lambda name: next((prefixes[name[:k]] for k in lengths if name[:k] in prefixes), None)
