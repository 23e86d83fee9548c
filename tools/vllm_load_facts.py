"""What vLLM's own load_weights does with a checkpoint's names, recorded for tools/vllm_profile.py (run in .venv-vllm):
the prefix each layer hands the quant config, renames made in code, and the NVFP4 leaves a class refuses.
Imports nothing from ``repair``."""

from __future__ import annotations

import os
import re
import sys

LAYER_NUMBER = re.compile(r"\.\d+(?=\.|$)")
TRAILING_NUMBER = re.compile(r"\.\d+$")
UNCARRIED = "<not carried over>"  # by_pattern's value for a name whose fact does not carry over to another config
QUOTED = re.compile(r"'[^'\n]{1,300}'")  # a name an error quotes
EXPERT = re.compile(r"\.experts\.\d+\.")  # one routed expert's own module (its FusedMoE layer's rule applies)


def log(msg: str) -> None:
    print(f"[vllm_profile] {msg}", file=sys.stderr, flush=True)


def pattern(name: str) -> str:
    return LAYER_NUMBER.sub(".*", name)


def record_asked_prefixes() -> None:
    """Shim (no decision logic): every layer remembers the `prefix` it hands the NVFP4 quant config's
    get_quant_method, the name vLLM matches exclusion entries against (not always the module's name)."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    cls = get_quantization_config("modelopt_fp4")
    asked = cls.get_quant_method

    def get_quant_method(self, layer, prefix):
        layer._asked_prefix = prefix
        return asked(self, layer, prefix)

    cls.get_quant_method = get_quant_method


def asked_prefix(modules: dict, name: str) -> str | None:
    """The prefix the layer holding module `name` (it, else its nearest ancestor that asked) handed the quant config."""
    while True:
        found = getattr(modules.get(name), "_asked_prefix", None)
        if found is not None or not name:
            return found
        name = name.rpartition(".")[0]


def mapped_name(model_class, module: str) -> str | None:
    """The module name the class's hf_to_vllm_mapper gives a checkpoint module's weight (an exclusion entry naming the
    module is mapped as itself: `entry_names`)."""
    mapper = getattr(model_class, "hf_to_vllm_mapper", None)
    if mapper is None:
        return module
    mapped = (getattr(mapper, "map_name", None) or mapper._map_name)(module + ".weight")  # public since 0.32
    return mapped[: -len(".weight")] if mapped and mapped.endswith(".weight") else mapped


def entry_names(model_class):
    """name -> the name an exclusion entry naming checkpoint module `name` becomes in vLLM's quant config: the entry
    mapped by the mapper variant vLLM's loader hands the quant config (`entry_variant`: no stacked maps, so `q_proj`
    stays `q_proj`). Not always the module's weight's name: Mistral Large 3's regex maps match `output.weight`, never
    the entry `output` (mistral_large_3.py: `\\Aoutput\\.weight\\Z`)."""
    mapper = getattr(model_class, "hf_to_vllm_mapper", None)
    if mapper is None:
        return lambda name: name
    variant = entry_variant()
    mapper = getattr(mapper, variant)() if variant else mapper
    return getattr(mapper, "map_name", None) or mapper._map_name  # public since 0.32


def entry_variant() -> str | None:
    """The WeightsMapper method whose result vLLM's loader hands the quant config's apply_vllm_mapper, read (ast) from
    model_loader/utils.py configure_quant_config: `get_rename_mapper` (0.30, 0.32: renames only), `get_unstacked_mapper`
    (0.28: no stacked maps); None where it hands the mapper whole. Anything else stops the tool: read that release."""
    import ast
    import inspect

    from vllm.model_executor.model_loader import utils

    calls = [n for n in ast.walk(ast.parse(inspect.getsource(utils.configure_quant_config)))
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "apply_vllm_mapper"]
    arg = calls[0].args[0] if len(calls) == 1 and len(calls[0].args) == 1 else None
    if isinstance(arg, ast.Name):
        return None
    if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and not arg.args:
        return arg.func.attr
    raise SystemExit("model_loader/utils.py configure_quant_config hands the quant config no mapper this tool reads "
                     f"({[ast.unparse(c) for c in calls]}): read how this release maps exclusion entries")


def stacked_name(model_class, module: str) -> str | None:
    """The layer the class's hf_to_vllm_mapper stacks checkpoint module `module` into by its `orig_to_new_stacked`
    alone (Orion's `q_proj` -> `qkv_proj`), else the module itself."""
    import dataclasses

    mapper = getattr(model_class, "hf_to_vllm_mapper", None)
    if mapper is None or not getattr(mapper, "orig_to_new_stacked", None):
        return module
    others = {f.name: type(getattr(mapper, f.name))() for f in dataclasses.fields(mapper) if f.name != "orig_to_new_stacked"}
    return mapped_name(type("Stacked", (), {"hf_to_vllm_mapper": dataclasses.replace(mapper, **others)}), module)


def placed_weights(model, weights: dict) -> tuple[dict[str, dict], dict[str, str]]:
    """(checkpoint module -> where vLLM's own load_weights puts it, module pattern -> vLLM's error where it refuses
    that module's weight). Where load_weights refuses the names fed at once, each module is fed alone, so one name it
    has no parameter for (transformers 5.25 saves Kimi-Linear's dense layer 0 as `block_sparse_moe.*`, which vLLM 0.28's
    kimi_k3/nvidia/model.py:1547 looks up as a parameter: KeyError) does not void every other module's facts; those
    were recorded as nothing placed, and the row read as if its load facts had been learned. A pattern refused in some
    layers and placed in others (A.X K1's layer 0, which transformers writes MoE and vLLM builds dense) says nothing
    of the pattern: logged, not recorded."""
    from raised_by import reraise_ours  # (a sibling: tools/ on the path where the tool runs)
    from vllm_declared import placements

    try:
        return placements(model, weights), {}
    except Exception as e:  # noqa: BLE001 - vLLM's refusal of one name: each module fed alone below
        reraise_ours(e)
        log(f"load_weights on the checkpoint names failed ({type(e).__name__}: {str(e)[:120]}): one module at a time")
    placed: dict[str, dict] = {}
    refused: dict[str, str] = {}
    for ckpt, weight in weights.items():
        try:
            placed.update(placements(model, {ckpt: weight}))
        except Exception as e:  # noqa: BLE001 - vLLM's own refusal of this module's weight, recorded
            reraise_ours(e)
            refused.setdefault(pattern(ckpt), refusal_text(e, ckpt))
    partly = {pattern(n) for n in placed} & set(refused)  # refused in some layers only (A.X K1's layer 0): no claim
    if partly:
        log(f"refused in some layers only, not recorded: {sorted(partly)}")
    return placed, {k: v for k, v in sorted(refused.items()) if k not in partly}


def refusal_text(error: BaseException, name: str) -> str:
    """vLLM's words for its refusal of checkpoint tensor or module `name` and the line that raised it, a quoted name's
    layer numbers `*` where they are `name`'s own in order (doctor puts the stored module's back: 'layers.*.mlp.ws_scale')."""
    numbers = LAYER_NUMBER.findall(name)

    def starred(quoted: re.Match) -> str:
        found = LAYER_NUMBER.findall(quoted.group(0))
        return LAYER_NUMBER.sub(".*", quoted.group(0)) if found and found == numbers[: len(found)] else quoted.group(0)

    return QUOTED.sub(starred, stable_text(error)) + where(error)


def where(error: BaseException) -> str:
    """` (vllm/...py:LINE)`: the line of vLLM that raised `error` (its innermost vllm frame), or ""."""
    import traceback

    frames = [f for f in traceback.extract_tb(error.__traceback__) if f"{os.sep}vllm{os.sep}" in f.filename]
    return f" (vllm/{frames[-1].filename.rpartition(os.sep + 'vllm' + os.sep)[2]}:{frames[-1].lineno})" if frames else ""


def load_renames(model, placed: dict, fused: dict) -> dict[str, str]:
    """Checkpoint module pattern -> the vLLM module pattern its load_weights puts it in, where neither the name nor
    the class's hf_to_vllm_mapper gives that module: a rename done in code (hy_v3.py: `mlp.router.gate` -> its
    unquantized `mlp.gate`; gemma3n.py: `model.embed_tokens_per_layer` -> `model.self_decoder.…`). Exclusion entries
    are not renamed this way (vLLM matches them on the layer's prefix: `prefixes`); what layer the module becomes is.
    Left out as in quant_prefixes: fused shards, per-expert names, FusedMoE layers (their tensors are no module)."""
    modules = dict(model.named_modules())
    shards = {s for group in fused.values() for s in group}
    out: dict[str, set[str]] = {}
    for ckpt, where in placed.items():
        target = where["vllm_module"]
        if (target in (ckpt, mapped_name(type(model), ckpt)) or EXPERT.search(ckpt) or ckpt.rpartition(".")[2] in shards
                or hasattr(modules.get(target), "w13_weight")):
            continue
        out.setdefault(pattern(ckpt), set()).add(pattern(target))
    return {k: v.pop() for k, v in sorted(out.items()) if len(v) == 1 and k not in v}


NVFP4_LEAVES = (("weight_scale", 16, "float8_e4m3fn"), ("weight_scale_2", 0, "float32"), ("input_scale", 0, "float32"))


def nvfp4_refusals(model, weights: dict, placed: dict, tensors: dict | None = None) -> dict[str, str]:
    """Checkpoint module pattern -> vLLM's error, where the class's own load_weights fails on one of ModelOpt's NVFP4
    leaves of a module it builds quantized (bloom.py reshapes every query_key_value tensor, a 0-d scale too; zamba2.py's
    mapper renames `.0.weight` but not `.0.input_scale`; gpt_oss.py looks a 3-D experts tensor's `_bias`, which ModelOpt
    keeps beside it, up among the NVFP4 FusedMoE's parameters, which have no bias). Each leaf is fed alone, as a meta
    tensor, through the recording loaders (nothing is copied: an error is load_weights' own); a module whose BF16 weight
    alone fails makes no claim. `tensors` (name -> (shape, dtype)): the saved checkpoint, for a 3-D tensor's siblings."""
    from raised_by import reraise_ours  # (a sibling: tools/ on the path where the tool runs)
    from vllm_declared import placements

    out: dict[str, str] = {}
    for ckpt, (name, shape, dtype) in weights.items():
        if not placed.get(ckpt, {}).get("quantized") or pattern(ckpt) in out or EXPERT.search(ckpt):
            continue
        if len(shape) == 3 and name == ckpt:
            leaves = [(name, shape, dtype)] + bmm_leaves(ckpt, shape, tensors or {})
        elif len(shape) == 2 and name.endswith(".weight"):
            leaves = [(name, shape, dtype)] + [(f"{ckpt}.{leaf}", [shape[0], shape[1] // per] if per else [], kind)
                                               for leaf, per, kind in NVFP4_LEAVES]
        else:
            continue
        for i, leaf in enumerate(leaves):
            try:
                placements(model, {leaf[0]: leaf})
            except Exception as e:  # noqa: BLE001 - vLLM's own refusal of this leaf, recorded
                reraise_ours(e)
                if i:
                    out[pattern(ckpt)] = stable_text(e)
                break
    return dict(sorted(out.items()))


def stable_text(e: Exception) -> str:
    """`Type: message`, at most 160 characters of it, and nothing of a set or dict it prints ("The available parameters
    ... are: {...}"): their order changes with Python's hash seed from run to run, and the shipped data is compared whole
    with a regeneration (tests/vllm/test_profiles_vs_vllm.py)."""
    text, brace, _ = str(e).partition("{")
    return f"{type(e).__name__}: {text[:160]}" + ("{...}" if brace and len(text) <= 160 else "")


def bmm_leaves(ckpt: str, shape: list[int], tensors: dict) -> list[tuple[str, list[int], str]]:
    """ModelOpt 0.47's NVFP4 tensors beside a 3-D experts tensor `X` [E, in, out] stored with no leaf (gpt-oss, Llama4;
    modelopt/torch/export/unified_export_hf.py _export_quantized_weight, quantizer_attr_names(X)): `X_weight_scale`
    [E, in/16, out], `X_weight_scale_2`, `X_input_scale`, and the tensors saved beside it (`X_bias`), kept unchanged."""
    experts, inn, columns = shape
    scales = [(f"{ckpt}_{leaf}", [experts, inn // per, columns] if per else [], kind) for leaf, per, kind in NVFP4_LEAVES]
    kept = [(n, list(s), d) for n, (s, d) in sorted(tensors.items()) if n.startswith(ckpt + "_") and n.endswith("_bias")]
    return scales + kept


def quant_prefixes(model, placed: dict, fused: dict) -> dict[str, str]:
    """Checkpoint module pattern -> the prefix vLLM matches exclusions against for the layer its own load_weights puts
    it in, where an exclusion entry naming the checkpoint module cannot reach that layer: a fused 3-D experts tensor
    loaded into the FusedMoE layer (GraniteMoe's `input_linear` -> `experts`), an lm_head built without a prefix
    (Afmoe: ""), Zamba2's LoRA adapters (`model.layers.*.shared_transformer.feed_forward.gate_up_proj_adapter_list.*.0`
    -> `model.feed_forward.gate_up_proj_adapter_list.{1}.A`: the shared block's prefix, the adapter index carried over).
    Only layers built quantized when nothing is excluded: for the others no exclusion changes anything.
    A shard of a fused layer is asked under the fused layer's prefix with its own leaf (quant_utils.py is_layer_skipped
    maps a fused prefix back to its shards): recorded only where that prefix's parent is not the shard's own (Exaone:
    `transformer.h.*.attn.attention.q_proj` is asked as `model.h.*.attn.attention.q_proj`, exaone.py:401-403), since a
    loader that splits a tensor itself hands the recorder unnamed pieces, placed under the name last read.
    Left to their own rules: per-expert names, and names the weight mapper renames as exclusion entries (vLLM maps
    entries through it too: `entry_names`)."""
    modules, entry_name = dict(model.named_modules()), entry_names(type(model))
    shards = {s for group in fused.values() for s in group}  # also keeps out a loader writing shards it split itself
    asked = {}
    for ckpt, where in placed.items():
        prefix = asked_prefix(modules, where["vllm_module"])
        if not where["quantized"] or prefix is None or EXPERT.search(ckpt):
            continue
        parent, _, leaf = ckpt.rpartition(".")
        if leaf in shards:
            prefix = shard_prefix(prefix, leaf, fused)
            if prefix is None or prefix.rpartition(".")[0] == parent:
                continue
        # a layer the mapper stacks the module into alone (Orion's q_proj -> qkv_proj, no packed mapping) is the
        # row's merged layer, asked as the layer by doctor's own rule (Architecture.asked_as)
        if prefix in (ckpt, entry_name(ckpt), stacked_name(type(model), ckpt)):
            continue
        asked[ckpt] = prefix
    # numbers the prefix does not take from the checkpoint name (Zamba2's "3.linear": 1 hybrid layer + layer 2) do not
    # carry over to another config: left out
    return by_pattern(asked, lambda ckpt, leaf: carried(ckpt, asked[ckpt], leaf))


def shard_prefix(prefix: str, shard: str, fused: dict) -> str | None:
    """The name vLLM's exclusion test asks for `shard` of the fused layer whose prefix is `prefix` (its leaf swapped for
    the shard's), or None where that layer's packed mapping does not hold the shard."""
    parent, _, leaf = prefix.rpartition(".")
    if shard not in fused.get(leaf, ()):
        return None
    return f"{parent}.{shard}" if parent else shard


def by_pattern(names, value) -> dict[str, str]:
    """Checkpoint name -> a fact (`value(name, leaf_kept)`), as checkpoint pattern (layer numbers `*`) -> the fact.
    Where one pattern gets several facts, its last number is kept as written: a module named by a number
    (nn.Sequential's; Zamba2's adapter `.0` is vLLM's A, `.1` its B) says which layer, not which repeat. A pattern whose
    facts still differ, or that has none (UNCARRIED), is left out: the fact does not carry over to another config."""
    groups: dict[str, list[str]] = {}
    for name in sorted(names):
        groups.setdefault(pattern(name), []).append(name)
    out: dict[str, str] = {}
    for key, members in groups.items():
        facts = {value(n, False) for n in members}
        if len(facts) == 1:
            out.update({key: f for f in facts if f is not UNCARRIED})
            continue
        kept: dict[str, set] = {}
        for n in members:
            if TRAILING_NUMBER.search(n):
                parent, _, leaf = n.rpartition(".")
                kept.setdefault(f"{pattern(parent)}.{leaf}", set()).add(value(n, True))
        out.update({k: f.pop() for k, f in kept.items() if len(f) == 1 and UNCARRIED not in f})
    return dict(sorted(out.items()))


def carried(ckpt: str, prefix: str, leaf_kept: bool) -> str:
    """`prefix` as a pattern of `ckpt`'s numbers: `*` where its numbers are the checkpoint name's in order (how the
    tool fills them), else `{i}` for the checkpoint name's i-th number where exactly one has that value; UNCARRIED where
    a number of the prefix is none of the name's, or several."""
    numbers = [m.group(0)[1:] for m in LAYER_NUMBER.finditer(ckpt)][: -1 if leaf_kept else None]
    parts = prefix.split(".")
    at = [i for i, p in enumerate(parts) if p.isdigit()]
    if [parts[i] for i in at] == numbers[: len(at)] and 0 not in at:
        return pattern(prefix)
    for i in at:
        found = [k for k, n in enumerate(numbers) if n == parts[i]]
        if len(found) != 1:
            return UNCARRIED
        parts[i] = "{%d}" % found[0]
    return ".".join(parts)


def renames(model_class, names: list[str]) -> dict[str, str | None]:
    """Checkpoint module pattern -> the vLLM name pattern hf_to_vllm_mapper gives it (None: dropped), where it differs."""
    if getattr(model_class, "hf_to_vllm_mapper", None) is None:
        return {}
    mapped = {n: mapped_name(model_class, n) for n in names}
    changed = [n for n in names if mapped[n] != n]
    return by_pattern(changed, lambda n, _: None if mapped[n] is None else pattern(mapped[n]))
