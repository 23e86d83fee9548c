"""What vLLM's own load_weights raises on ModelOpt's NVFP4 tensors of routed experts it holds in stacked parameters of
its own (run in .venv-vllm; tools/vllm_profile.py records the answers in a row's `variants`). Imports nothing from
``repair``.

vLLM 0.32's MiniCPMMoE (minicpm.py:122-139) holds every expert in BF16 `ws` / `w2s` parameters with no quant method,
and its load_weights names the checkpoint's experts in a list of its own (`expert_params_mapping`, minicpm.py:495-503:
(param, `experts.{e}.{w}.weight`, e)), replacing the weight name inside any tensor name holding it: an NVFP4 expert's
`experts.0.w1.weight_scale` becomes `ws_scale`, which it has no parameter for (KeyError). No transformers class writes
those names and FusedMoE's get_expert_mapping does not hold them, so the layout is the one the loader's list names:
the list is evaluated with the module whose load_weights holds it as `self` (its own expression, nothing else in
scope), and each name is proven to reach its parameter by the loader's own replacement.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

from vllm_load_facts import NVFP4_LEAVES, log, pattern, refusal_text

MAPPING = "expert_params_mapping"


def loader_experts(model) -> dict[str, list[str]]:
    """Stacked expert parameter (full name) -> the checkpoint tensors a module's load_weights names for it in its own
    `expert_params_mapping` list of (param, weight name, ...) (the weight name replaced by the param's in the tensor
    name gives the parameter: proven per name). {} where no load_weights holds such a list."""
    params = dict(model.named_parameters())
    out: dict[str, list[str]] = {}
    for module in model.modules():
        for param, weight in mapping_of(module):
            for name in params:
                parent, _, leaf = name.rpartition(".")
                ckpt = f"{parent}.{weight}" if parent else weight
                if leaf == param and weight.endswith(".weight") and ckpt.replace(weight, param) == name:
                    out.setdefault(name, []).append(ckpt)
    return out


def mapping_of(module) -> list[tuple[str, str]]:
    """(param leaf, weight name) pairs of the `expert_params_mapping` list the module's own load_weights assigns as a
    list display or comprehension, evaluated with `self` = the module; [] where it assigns none or the expression needs
    more than `self` and range (logged)."""
    function = type(module).__dict__.get("load_weights")
    if function is None:
        return []
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return []
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == MAPPING and isinstance(node.value, (ast.List, ast.ListComp))):
            continue
        try:
            items = eval(compile(ast.Expression(node.value), "<expert_params_mapping>", "eval"),  # noqa: S307 - vLLM's own
                         {"__builtins__": {}, "range": range, "self": module})  # globals: a comprehension's own scope sees them
        except (NameError, AttributeError, TypeError, LookupError, ValueError, ArithmeticError) as e:  # no claim, said
            log(f"{type(module).__name__}.load_weights' {MAPPING} not evaluated ({type(e).__name__}: {e}): no refusal learned")
            continue
        out += [(i[0], i[1]) for i in items if isinstance(i, tuple) and len(i) >= 2
                and isinstance(i[0], str) and isinstance(i[1], str)]
    return out


def expert_refusals(model) -> dict[str, str]:
    """Checkpoint tensor pattern -> vLLM's error, for each NVFP4 leaf (weight_scale, weight_scale_2, input_scale:
    ModelOpt's) of a stacked-parameter expert that its load_weights raises on, where its BF16 weight alone loads: each
    in its own words (MiniCPMMoE's input_scale falls through to a lookup under its own name, its weight_scale is
    rewritten to `ws_scale`), so doctor names the one the release meets first in its load order. Each tensor is fed
    alone, as a meta tensor, through the recording loaders (tools/vllm_declared.py)."""
    from raised_by import reraise_ours  # (a sibling: tools/ on the path where the tool runs)
    from vllm_declared import placements

    params = dict(model.named_parameters())
    out: dict[str, str] = {}
    for param, names in sorted(loader_experts(model).items()):
        shape = list(params[param].shape[1:])
        for ckpt in names:
            module = ckpt.removesuffix(".weight")
            if any(k.startswith(pattern(module) + ".") for k in out):
                continue  # another layer's or expert's of the same pattern: learned
            try:
                if ckpt not in placements(model, {ckpt: (ckpt, shape, "bfloat16")}):
                    continue  # placed nowhere: no claim about its NVFP4 leaves
            except Exception as e:  # noqa: BLE001 - the BF16 weight itself is refused: no claim about its NVFP4 leaves
                reraise_ours(e)
                continue
            for leaf, per, kind in NVFP4_LEAVES:
                name = f"{module}.{leaf}"
                try:
                    placements(model, {name: (name, [shape[0], shape[1] // per] if per else [], kind)})
                except Exception as e:  # noqa: BLE001 - vLLM's own refusal of this leaf, recorded
                    reraise_ours(e)
                    out[pattern(name)] = refusal_text(e, name)
    return dict(sorted(out.items()))
