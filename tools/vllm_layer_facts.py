"""Which checkpoint modules vLLM's model drops in which decoder layers, as a rule over config fields (run in .venv-vllm).

Gemma 3n's KV-shared layers (the last `num_kv_shared_layers`) have no k_proj/v_proj/k_norm in vLLM 0.30+: gemma3n.py's
`_kv_sharing_weights_mapper` maps those checkpoint names to None, so vLLM neither builds nor expects them there, while
every earlier layer loads them into qkv_proj. The profile's `*` layer patterns erase that, so it is recorded per layer:
each tensor transformers' own class saves for the export's config is fed, at every layer number of its stack, alone
and as a meta tensor, through the class's own load_weights (recording loaders: nothing is copied); a module whose
tensors load nowhere (no error: the mapper or the loader skipped them) is dropped at that layer. Where the dropped
layers are the first or the last k of the stack, the config field holding k is found, and confirmed by building vLLM's
model again with that field one larger (the dropped run must grow by one): the rule then carries over to a published
config's layer count. A set no rule fits (or that two fields fit) is not recorded. Imports nothing from ``repair``.

A module vLLM builds per a per-layer list of config.json (DeepSeek-V4's attention builds its compressor where
`compress_ratios[i]` > 1 and its indexer where it is 4: models/deepseek_v4/attention.py:233-368) is absent from the
export's layers whose entry has some values: `where_rules` records the list field and those values where vLLM's own
built model lacks the module in exactly those layers, confirmed by building vLLM's model again with the list rotated
by one (the absent layers must move with the values). Its load_weights raises on such a name (KeyError), so it is
not found by feeding names as above.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable
from raised_by import reraise_ours

STACK = re.compile(r"(.+?\.layers)\.(\d+)\.(.+)")
LAYER = re.compile(r"((?:.*?\.)?layers)\.(\d+)\.(.+)")  # a stack may be the top level (DeepSeek-V4's `layers.N.`)
SCALARS = (int, str)  # the values a per-layer list rule compares
RUNS = {"first": lambda k, depth: set(range(k)), "last": lambda k, depth: set(range(depth - k, depth))}
COUNT = "num_hidden_layers"


def dropped_layers(model, tensors: dict[str, tuple[list[int], str]], depth: int) -> dict[str, set[int]]:
    """Checkpoint module pattern (`*` = the layer) -> the layers of its stack where vLLM's load_weights puts none of
    its tensors and raises nothing (a name it refuses makes no claim)."""
    from vllm_declared import placements

    examples: dict[tuple[str, str], tuple[list[int], str]] = {}
    for name, (shape, dtype) in tensors.items():
        match = STACK.fullmatch(name)
        if match:
            examples.setdefault((match[1], match[3]), (shape, dtype))
    kept: dict[str, set[int]] = defaultdict(set)  # module pattern -> layers where some tensor of it loads (or raises)
    seen: set[str] = set()
    for (stack, rest), (shape, dtype) in sorted(examples.items()):
        module = f"{stack}.*.{rest.rpartition('.')[0]}"
        seen.add(module)
        for layer in range(depth):
            name = f"{stack}.{layer}.{rest}"
            try:
                placed = placements(model, {name: (name, shape, dtype)})
            except Exception as e:  # noqa: BLE001 - refused: no claim that vLLM drops it
                reraise_ours(e)
                placed = {name: None}
            if name in placed:
                kept[module].add(layer)
    return {m: set(range(depth)) - kept[m] for m in sorted(seen) if set(range(depth)) - kept[m]}


def layer_rules(model, tensors: dict, config: dict, rebuild: Callable[[dict], object]) -> dict[str, dict[str, str]]:
    """Checkpoint module pattern -> {"first" | "last": config field}: vLLM drops the module in the first / last
    config[field] layers of its stack (field confirmed by `rebuild(config with field + 1)`)."""
    part = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    depth = part.get(COUNT)
    if type(depth) is not int or not tensors:
        return {}
    dropped = {m: s for m, s in dropped_layers(model, tensors, depth).items() if len(s) < depth}
    fields = {f: v for f, v in part.items() if type(v) is int and f != COUNT}  # what a layer rule may name
    out: dict[str, dict[str, str]] = {}
    confirmed: dict[tuple[str, str], dict[str, set[int]]] = {}  # (run, field) -> what the rebuilt model drops
    for module, layers in dropped.items():
        fits = []
        for run, layers_of in RUNS.items():
            k = len(layers)
            if layers != layers_of(k, depth) or k + 1 >= depth:
                continue
            for field in (f for f, v in fields.items() if v == k):
                if (run, field) not in confirmed:
                    grown = dict(part, **{field: k + 1})
                    changed = dict(config, text_config=grown) if part is not config else grown
                    try:
                        confirmed[(run, field)] = dropped_layers(rebuild(changed), tensors, depth)
                    except Exception as e:  # noqa: BLE001 - vLLM refuses the changed config: the field is not confirmed
                        reraise_ours(e)
                        confirmed[(run, field)] = {}
                if confirmed[(run, field)].get(module) == layers_of(k + 1, depth):
                    fits.append({run: field})
        if len(fits) == 1:
            out[module] = fits[0]
    return out


def _absent(names, depth: int) -> dict[str, frozenset[int]]:
    """Module pattern (`*` = the layer) -> the layers 0..depth-1 without it, for modules some of those layers have."""
    present: dict[str, set[int]] = defaultdict(set)
    for name in names:
        match = LAYER.fullmatch(name)
        if match and int(match[2]) < depth:
            present[f"{match[1]}.*.{match[3].rpartition('.')[0]}"].add(int(match[2]))
    return {m: frozenset(range(depth)) - s for m, s in present.items() if len(s) < depth}


def built_absent(model, depth: int) -> dict[str, frozenset[int]]:
    """vLLM's model's own parameters: module pattern -> the decoder layers it builds it in none of."""
    return _absent((name for name, _ in model.named_parameters()), depth)


def where_rules(model, tensors: dict, config: dict, rebuild: Callable[[dict], object]) -> dict[str, dict]:
    """Checkpoint module pattern -> {"where": field, "in": values}: vLLM builds it in no layer i whose config[field][i]
    is one of values and in every other layer of the export (see the docstring; field confirmed by `rebuild(list
    rotated)`)."""
    part = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    depth = part.get(COUNT)
    if type(depth) is not int or not tensors:
        return {}
    lists = {f: v for f, v in part.items() if isinstance(v, list) and len(v) == depth
             and all(type(x) in SCALARS for x in v) and v[1:] + v[:1] != v}
    built = built_absent(model, depth)
    out: dict[str, dict] = {}
    rebuilt: dict[str, dict[str, frozenset[int]]] = {}
    for module, layers in sorted(_absent(tensors, depth).items()):
        fits = []
        for field, values in lists.items():
            without = {values[i] for i in layers}
            if without & {values[i] for i in range(depth) if i not in layers} or layers not in built.values():
                continue
            rotated = values[1:] + values[:1]
            moved = frozenset(i for i in range(depth) if rotated[i] in without)
            if moved == layers:
                continue  # the rotation cannot tell this field from the layer numbers
            if field not in rebuilt:
                changed = dict(part, **{field: rotated})
                try:
                    rebuilt[field] = built_absent(rebuild(dict(config, text_config=changed) if part is not config
                                                          else changed), depth)
                except Exception as e:  # noqa: BLE001 - vLLM refuses the rotated list: the field is not confirmed
                    reraise_ours(e)
                    rebuilt[field] = {}
            if any(rebuilt[field].get(p) == moved for p, s in built.items() if s == layers):
                fits.append({"where": field, "in": sorted(without, key=lambda x: (type(x).__name__, x))})
        if len(fits) == 1:
            out[module] = fits[0]
    return out


def main(argv: list[str]) -> int:
    """`vllm_layer_facts.py ARCH OVERRIDES.json`: one JSON line, {module pattern: [layers vLLM drops it in]} for the
    profile's export config of ARCH with OVERRIDES applied (`_refused`: the layers to exclude, the profile's
    nvfp4_refused); the vLLM tier checks the profile's rules against it at a published config's depth."""
    import json
    import tempfile

    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm_profile import build_model, no_triton_allocator, saved_tensors, write_config
    from vllm_profile_configs import PUBLISHED, model_types, small_config
    from vllm_runtime import (emit, enable_cpu_nvfp4, kernel_stand_ins, nvfp4_moe_emulation_fallback,
                              torchvision_stand_in)

    enable_cpu_nvfp4()
    nvfp4_moe_emulation_fallback()
    torchvision_stand_in()
    kernel_stand_ins()
    no_triton_allocator()
    arch, overrides = argv[0], json.load(open(argv[1], encoding="utf-8"))
    refused = overrides.pop("_refused", [])
    config = {**small_config(arch, model_types())[0], **PUBLISHED.get(arch, {}), **overrides}
    with tempfile.TemporaryDirectory() as folder:
        write_config(folder, arch, config, refused)
        model = build_model(folder, initialize_model)[0]
    part = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    dropped = dropped_layers(model, saved_tensors(arch, config), part[COUNT])
    emit({m: sorted(s) for m, s in dropped.items()})
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
