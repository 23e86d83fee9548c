"""What transformers' own model class writes for a small config: the checkpoint names a vLLM profile row learns its
layout facts from (renames, prefixes, refusals, dropped tensors), and when there are none to learn (run in .venv-vllm).

A row learned from no names would record no facts and read as healthy: an architecture whose class cannot build or
save the small config, or that only vLLM's own names describe where those hold fused experts, is unprofiled instead
(NoConfig, with the reason). Imports nothing from ``repair``.
"""

from __future__ import annotations

import os
import tempfile

from vllm_load_facts import log
from vllm_profile_configs import NoConfig

NO_LAYOUT = ("no checkpoint layout to learn: transformers has no class that writes its names, and vLLM's own names of "
             "its fused experts are none (FusedMoE's weight loader takes one expert per tensor)")
RENAMED = (NO_LAYOUT.partition(":")[0] + ": transformers has no class that writes its names, and vLLM's "
           "hf_to_vllm_mapper renames the published ones")
REFUSED = (NO_LAYOUT.partition(":")[0] + ": transformers has no class that writes its names, and vLLM's own "
           "load_weights does not take its own names")
# transformers' class exists but refuses the small config or its save: no names to learn, never a row without them
UNBUILT = "transformers' own class cannot build or save it at the small size"

def transformers_model(arch: str, config: dict, device: str):
    """transformers' own model class for this config, built on `device` (None when it has none or cannot build it)."""
    import torch
    import transformers

    cls = getattr(transformers, arch, None)
    if cls is None:
        return None
    try:
        with torch.device(device):
            return cls(cls.config_class(**{k: v for k, v in config.items() if k != "model_type"}))
    except Exception as e:  # noqa: BLE001 - a row learned from no names would read as healthy: unprofiled, and why
        log(f"{arch}: transformers build on {device} failed ({type(e).__name__}: {str(e)[:120]})")
        raise NoConfig(f"{UNBUILT} (built on {device}): {type(e).__name__}: {str(e)[:160]}") from None


def own_names_layout(model) -> None:
    """Raise NoConfig where vLLM's own parameter names are no checkpoint layout to learn from, for an architecture no
    transformers class writes: a parameter of dim > 2 that is no routed-experts layer naming its checkpoint tensors
    (`own_checkpoint`); a hf_to_vllm_mapper that renames (prefixes, substrings, ...: anything but stacking shards into
    a fused layer, or dropping names), which says the published names are others no class here writes; names vLLM's
    own load_weights does not take. A row learned from no names would record no prefixes, renames or refusals and
    read as healthy."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    renaming = {k: v for k, v in vars(mapper).items() if k != "orig_to_new_stacked" and v
                and (not isinstance(v, dict) or any(x is not None for x in v.values()))} if mapper is not None else {}
    if renaming:
        raise NoConfig(f"{RENAMED}: {', '.join(sorted(renaming))}")
    refused = own_names_refused(model)
    if refused:
        raise NoConfig(f"{REFUSED}: {refused}")


def own_names_refused(model) -> str | None:
    """What vLLM's own load_weights does with `own_checkpoint`'s weights fed through it on the meta device (recording
    weight loaders, tools/vllm_declared.py): its error, or the first name it placed nowhere; None when it takes all."""
    from vllm_declared import placements

    weights = saved_weights({n: (shape, "bfloat16") for n, shape in own_checkpoint(model).items()})
    try:
        placed = placements(model, weights)
    except Exception as e:  # noqa: BLE001 - the refusal is the fact
        return f"{type(e).__name__}: {str(e)[:160]}"
    missed = sorted(set(weights) - set(placed))
    return f"{missed[0]} placed nowhere" if missed else None


def own_checkpoint(model) -> dict[str, list[int]]:
    """Tensor name -> shape of the checkpoint vLLM's own names describe: its parameters, each fused layer of the
    class's packed_modules_mapping or of its mapper's stacked names (`stacked_shards`) stored as its shards (the names
    its load_weights stacks, e.g. InternLM2's `feed_forward.w1` / `w3` into `gate_up_proj`), split at the layer's own output_sizes, and each routed expert as
    the tensors its layer's expert mapping names (`expert_tensors`; any other parameter of at most 2 dims on a module
    with an expert mapping is its own: DeepSeek-V4's model holds `hc_head_fn` beside its get_expert_mapping). NoConfig for any other
    parameter of dim > 2."""
    own = getattr(model, "packed_modules_mapping", None) or {}
    packed = {**stacked_shards(model), **{k: list(v) for k, v in own.items() if list(v) != [k]}}
    modules = dict(model.named_modules())
    out: dict[str, list[int]] = {}
    for name, param in model.named_parameters():
        module, leaf = name.rpartition(".")[::2]
        if hasattr(modules.get(module), "get_expert_mapping"):
            experts = expert_tensors(module, modules[module], leaf, list(param.shape))
            if experts or param.dim() > 2:
                out.update(experts)
                continue
        if param.dim() > 2:
            raise NoConfig(NO_LAYOUT)
        parent, _, fused = module.rpartition(".")
        sizes = getattr(modules.get(module), "output_sizes", None)
        if fused not in packed or not sizes or len(sizes) != len(packed[fused]) or param.shape[0] != sum(sizes):
            out[name] = list(param.shape)
            continue
        for shard, size in zip(packed[fused], sizes):
            out[f"{parent}.{shard}.{leaf}" if parent else f"{shard}.{leaf}"] = [size, *param.shape[1:]]
    return out



def stacked_shards(model) -> dict[str, list[str]]:
    """Fused layer -> its shards as the class's hf_to_vllm_mapper stacks them (`orig_to_new_stacked`, e.g. orion.py's
    `.q_proj` -> (`.qkv_proj`, "q")): the published names of a class with no packed_modules_mapping (Orion-14B stores
    q_proj / k_proj / v_proj), which its load_weights takes and its quant config never sees as one layer."""
    stacked = getattr(getattr(model, "hf_to_vllm_mapper", None), "orig_to_new_stacked", None) or {}
    out: dict[str, list[str]] = {}
    for orig, (new, _) in stacked.items():
        out.setdefault(new.rpartition(".")[2], []).append(orig.rpartition(".")[2])
    return out


def expert_tensors(module: str, layer, leaf: str, shape: list[int]) -> dict[str, list[int]]:
    """The checkpoint tensors of one routed-experts parameter (`w13_weight` [E, 2I, H], `w2_weight`, their biases):
    one per expert and shard, named by the layer's own get_expert_mapping() (vLLM 0.32 fused_moe/routed_experts.py:
    (param_name, weight_name, expert, shard), both relative to the MoE runner's parent, e.g. `experts.w13_` <-
    `experts.0.gate_proj.`), w13 split evenly among the shards it stacks. A quantized build's scales are no names."""
    kind, _, rest = leaf.partition("_")
    if rest not in ("weight", "bias"):
        return {}
    runner = module.removesuffix(".routed_experts")
    parent, _, own = runner.rpartition(".")
    mapped = [(w, e, s) for p, w, e, s in layer.get_expert_mapping() if p == f"{own}.{kind}_"]
    shards = len({s for _, e, s in mapped if e == mapped[0][1]}) if mapped else 0
    if not shards or shape[1] % shards:
        raise NoConfig(NO_LAYOUT)
    return {f"{parent}.{w}{rest}" if parent else f"{w}{rest}": [shape[1] // shards, *shape[2:]] for w, _, _ in mapped}


def mapper_inverse(mapper, name: str) -> str | None:
    """The checkpoint name `mapper` (the class's hf_to_vllm_mapper, a WeightsMapper) maps onto vLLM's own `name`: read
    back through every rename whose new side `name` shows, suffix maps, then prefix maps, then substring maps, each in
    reverse order (the reverse of how vLLM 0.32 applies them: model_executor/models/utils.py:108-144); None unless
    mapping the result forward gives `name` again (a regex or stacked rename, or renames that undo each other, are no
    inverse this reads)."""
    key = name
    for old, new in reversed(list(mapper.orig_to_new_suffix.items())):
        if new is not None and key.endswith(new):
            key = old.join(key.rsplit(new, 1))
    for old, new in reversed(list(mapper.orig_to_new_prefix.items())):
        if new is not None and key.startswith(new):
            key = old + key[len(new):]
    for old, new in reversed(list(mapper.orig_to_new_substr.items())):
        if new is not None and new in key:
            key = key.replace(new, old, 1)
    return key if mapper.map_name(key) == name else None


def published_checkpoint(model) -> dict[str, list[int]]:
    """Tensor name -> shape of the published checkpoint of an MAPPER_LAYOUT architecture (vllm_profile_configs): vLLM's own
    names (`own_checkpoint`: fused layers as their shards, experts one tensor each) read back through the class's own
    hf_to_vllm_mapper (`mapper_inverse`), the names it is written for. NoConfig where one name reads back to nothing."""
    mapper = getattr(model, "hf_to_vllm_mapper", None)
    out: dict[str, list[int]] = {}
    for name, shape in own_checkpoint(model).items():
        published = mapper_inverse(mapper, name) if mapper is not None else None
        if published is None:
            raise NoConfig(f"{NO_LAYOUT.partition(':')[0]}: vLLM's hf_to_vllm_mapper maps no name onto its own {name}")
        out[published] = shape
    return dict(sorted(out.items()))


def tensor_modules(tensors: dict[str, tuple[list[int], str]]) -> list[str]:
    """Module names of a checkpoint's 2-D weights (as checkpoint_names gives them for transformers' model)."""
    return sorted({n.rpartition(".")[0] for n, (shape, _) in tensors.items() if n.endswith(".weight") and len(shape) == 2})


def checkpoint_names(model) -> list[str]:
    """Module names of transformers' model (its state_dict's 2-D weights), what the weight mapper is asked about."""
    if model is None:
        return []
    return sorted({n.rpartition(".")[0] for n, t in model.state_dict().items() if n.endswith(".weight") and t.dim() == 2})


def saved_weights(tensors: dict[str, tuple[list[int], str]]) -> dict[str, tuple[str, list[int], str]]:
    """Checkpoint module -> (tensor name, shape, dtype) of every 2-D / 3-D weight of a saved checkpoint (its names are
    a published export's, e.g. GraniteMoe's fused 3-D `input_linear`; a 3-D tensor stored without a `.weight` leaf,
    GptOss's `experts.gate_up_proj`, is its own module)."""
    out = {}
    for n, (shape, dtype) in tensors.items():
        module, leaf = n.rpartition(".")[::2]
        if len(shape) >= 2 and (leaf == "weight" or (len(shape) == 3 and not leaf.endswith("bias"))):
            out[module if leaf == "weight" else n] = (n, shape, dtype)
    return dict(sorted(out.items()))


def saved_tensors(arch: str, config: dict) -> dict[str, tuple[list[int], str]]:
    """Tensor name -> (shape, dtype) of what transformers' own save_pretrained writes for this config (tiny, on CPU)."""
    import torch
    from safetensors import safe_open

    model = transformers_model(arch, config, "cpu")
    if model is None:
        return {}
    out = {}
    with tempfile.TemporaryDirectory() as folder:
        try:
            model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)
        except Exception as e:  # noqa: BLE001 - no names, no facts: unprofiled, and why
            log(f"{arch}: save_pretrained failed ({type(e).__name__}: {str(e)[:120]})")
            raise NoConfig(f"{UNBUILT} (save_pretrained): {type(e).__name__}: {str(e)[:160]}") from None
        for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            with safe_open(os.path.join(folder, file), "pt") as f:
                out.update({n: (list(f.get_slice(n).get_shape()), "bfloat16") for n in f.keys()})
    return dict(sorted(out.items()))
