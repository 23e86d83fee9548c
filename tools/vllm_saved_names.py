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
from vllm_profile_configs import NoConfig, written_as
from raised_by import reraise_ours

NO_LAYOUT = ("no checkpoint layout to learn: transformers has no class that writes its names, and vLLM's own names of "
             "its fused experts are none (FusedMoE's weight loader takes one expert per tensor)")
REFUSED = (NO_LAYOUT.partition(":")[0] + ": transformers has no class that writes its names, and vLLM's own "
           "load_weights does not take its own names")
# transformers' class exists but refuses the small config or its save: no names to learn, never a row without them
UNBUILT = "transformers' own class cannot build or save it at the small size"

def transformers_model(arch: str, config: dict, device: str):
    """transformers' own model class for this config, built on `device` (None when it has none or cannot build it)."""
    import torch
    import transformers

    cls = getattr(transformers, written_as(arch), None)
    if cls is None:
        return None
    try:
        with torch.device(device):
            return cls(cls.config_class(**{k: v for k, v in config.items() if k != "model_type"}))
    except Exception as e:  # noqa: BLE001 - a row learned from no names would read as healthy: unprofiled, and why
        reraise_ours(e)
        log(f"{arch}: transformers build on {device} failed ({type(e).__name__}: {str(e)[:120]})")
        raise NoConfig(f"{UNBUILT} (built on {device}): {type(e).__name__}: {str(e)[:160]}") from None


def own_names_layout(model) -> None:
    """Raise NoConfig where vLLM's own parameter names are no checkpoint layout to learn from, for an architecture no
    transformers class writes: a parameter of dim > 2 that is no routed-experts layer naming its checkpoint tensors
    (`own_checkpoint`); a hf_to_vllm_mapper that renames (prefixes, substrings, ...: anything but stacking shards into
    a fused layer, or dropping names) where it is not proven invertible on those names (tools/vllm_mapper_inverse.py:
    then the published names are others no class here writes); names vLLM's own load_weights does not take. A row
    learned from no names would record no prefixes, renames or refusals and read as healthy."""
    refused = own_names_refused(model)
    if refused:
        raise NoConfig(f"{REFUSED}: {refused}")


def own_names_refused(model) -> str | None:
    """What vLLM's own load_weights does with `published_checkpoint`'s weights fed through it on the meta device
    (recording weight loaders, tools/vllm_declared.py): its error, or the first name it placed nowhere; None when it
    takes all."""
    from vllm_declared import placements

    weights = saved_weights({n: (shape, "bfloat16") for n, shape in published_checkpoint(model).items()})
    try:
        placed = placements(model, weights)
    except Exception as e:  # noqa: BLE001 - the refusal is the fact
        reraise_ours(e)
        return f"{type(e).__name__}: {str(e)[:160]}"
    missed = sorted(set(weights) - set(placed))
    return f"{missed[0]} placed nowhere" if missed else None


def published_checkpoint(model) -> dict[str, list[int]]:
    """`own_checkpoint` under the names the class's hf_to_vllm_mapper renames from, where it renames: TeleChat2's
    `transformer.h.N.self_attention.dense`, Mistral Large 3's `layers.N.attention.wq_a` (tools/vllm_mapper_inverse.py,
    NoConfig where the inverse is not proven); vLLM's own names where it does not."""
    from vllm_mapper_inverse import published_names, renaming_maps

    own = own_checkpoint(model)
    if not renaming_maps(getattr(model, "hf_to_vllm_mapper", None)):
        return own
    names = published_names(model, sorted(own))
    return {names[n]: shape for n, shape in own.items()}


def own_checkpoint(model) -> dict[str, list[int]]:
    """Tensor name -> shape of the checkpoint vLLM's own names describe: its parameters, each fused layer of the
    class's packed_modules_mapping, of its mapper's stacked names (`stacked_shards`) or of its load_weights' own
    `stacked_params_mapping` (`loader_stacking`) stored as its shards (the names
    its load_weights stacks, e.g. InternLM2's `feed_forward.w1` / `w3` into `gate_up_proj`), split at the layer's own output_sizes, and each routed expert as
    the tensors its layer's expert mapping names (`expert_tensors`; any other parameter of at most 2 dims on a module
    with an expert mapping is its own: DeepSeek-V4's model holds `hc_head_fn` beside its get_expert_mapping). NoConfig for any other
    parameter of dim > 2."""
    own = getattr(model, "packed_modules_mapping", None) or {}
    packed = {**loader_stacking(model), **stacked_shards(model), **{k: list(v) for k, v in own.items() if list(v) != [k]}}
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


def loader_stacking(model) -> dict[str, list[str]]:
    """Fused layer -> its shards as a load_weights among the model's modules stacks them in its own
    `stacked_params_mapping` list of (param, shard, shard id) literals (iquest_loopcoder.py:467-473: `gate_up_proj`
    from `gate_proj` / `up_proj`), for a class that names them nowhere else (no packed_modules_mapping, no mapper)."""
    import ast
    import inspect
    import textwrap

    out: dict[str, list[str]] = {}
    for function in {getattr(type(m), "load_weights", None) for m in model.modules()} - {None}:
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        except (OSError, TypeError, SyntaxError):
            continue
        for node in ast.walk(tree):
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else getattr(node, "target", None)
            if not (isinstance(target, ast.Name) and target.id == "stacked_params_mapping"
                    and isinstance(getattr(node, "value", None), ast.List)):
                continue
            for item in node.value.elts:
                parts = item.elts if isinstance(item, ast.Tuple) and len(item.elts) == 3 else []
                if parts and all(isinstance(p, ast.Constant) and isinstance(p.value, str) for p in parts[:2]):
                    shards = out.setdefault(parts[0].value.strip("."), [])
                    shards += [parts[1].value.strip(".")] if parts[1].value.strip(".") not in shards else []
    return {k: v for k, v in sorted(out.items()) if len(v) > 1}


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
            reraise_ours(e)
            log(f"{arch}: save_pretrained failed ({type(e).__name__}: {str(e)[:120]})")
            raise NoConfig(f"{UNBUILT} (save_pretrained): {type(e).__name__}: {str(e)[:160]}") from None
        for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
            with safe_open(os.path.join(folder, file), "pt") as f:
                out.update({n: (list(f.get_slice(n).get_shape()), "bfloat16") for n in f.keys()})
    return dict(sorted(out.items()))
