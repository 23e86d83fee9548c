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
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Callable

STACK = re.compile(r"(.+?\.layers)\.(\d+)\.(.+)")
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
            except Exception:  # noqa: BLE001 - refused: no claim that vLLM drops it
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
                    except Exception:  # noqa: BLE001 - vLLM refuses the changed config: the field is not confirmed
                        confirmed[(run, field)] = {}
                if confirmed[(run, field)].get(module) == layers_of(k + 1, depth):
                    fits.append({run: field})
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
