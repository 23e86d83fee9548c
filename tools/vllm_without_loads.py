"""Checkpoint modules only one of an architecture's two builds loads (run in .venv-vllm, by vllm_profile.py).

Where config fields choose the attention class (vLLM 0.32's Qwen4Exp builds QSA only when `indexer_n_heads` is set:
models/qwen4_exp/nvidia/model.py:243), the profile records the build with those fields null as `without`. The QSA
build's load_weights takes the indexer's tensors (its projection into the fused qkv_proj, model.py:704; its two
norms as their own parameters), which the build without them has no parameter for: a QSA checkpoint that lacks them
runs on uninitialised memory, or stops where vLLM tracks weights; a checkpoint without QSA that stores them is
refused. Each module of transformers' export of the profiled config is fed alone, as a meta tensor, through each
build's own load_weights (tools/vllm_declared.py's recording loaders: nothing is copied). Recorded: the modules the
profiled build places and the `without` build places nothing of, as name patterns (`without.loads_only_with`), and
the error the `without` build's load_weights raises on each (`without.refused_only_with`).
Imports nothing from ``repair``.
"""

from __future__ import annotations

from vllm_load_facts import pattern
from raised_by import reraise_ours


def loads_only_with(model, vc, other, other_vc, tensors: dict[str, tuple[list[int], str]]) -> tuple[list[str], dict[str, str]]:
    """(patterns, refusals): name patterns of the checkpoint modules (transformers' export of the profiled config:
    `tensors`, name -> (shape, dtype)) all of whose tensors `model`'s load_weights places and none of which `other`'s
    places (it raises, "There is no module or parameter named ...", or drops them); each module is fed alone. And,
    for each such pattern `other`'s load_weights raises on, its error (the module's layer numbers written `*`)."""
    by_module: dict[str, dict] = {}
    for name, (shape, dtype) in tensors.items():
        by_module.setdefault(name.rpartition(".")[0], {})[name] = (name, shape, dtype)
    placed, elsewhere = _placed(model, vc, by_module), _placed(other, other_vc, by_module)
    only = [m for m in by_module if placed[m][0] == len(by_module[m]) and not elsewhere[m][0]]
    refusals = {pattern(m): _layer_numbers_starred(elsewhere[m][1], m) for m in only if elsewhere[m][1]}
    return sorted({pattern(m) for m in only}), dict(sorted(refusals.items()))


def _layer_numbers_starred(error: str, module: str) -> str:
    """The error's first sentence (vLLM's "There is no module or parameter named ..." goes on to list the layer's
    parameters from a set, in no fixed order), with the module's layer numbers written `*`."""
    first = error.split(". ", 1)[0] + "." if ". " in error else error
    for n in [n for n in module.split(".") if n.isdigit()]:
        first = first.replace(f".{n}.", ".*.")
    return first


def _placed(model, vc, by_module: dict[str, dict]) -> dict[str, tuple[int, str]]:
    """Module -> (how many of its tensors the model's own load_weights places, each module fed alone (0 where it
    raises), the error it raises or "")."""
    from vllm.config import set_current_vllm_config
    from vllm_declared import placements
    from vllm_runtime import world_of_one

    out = {}
    with world_of_one(vc), set_current_vllm_config(vc):
        for module, weights in by_module.items():
            try:
                out[module] = (len(placements(model, weights)), "")
            except Exception as e:  # noqa: BLE001 - the build's own load_weights refused the names: none placed
                reraise_ours(e)
                out[module] = (0, f"{type(e).__name__}: {e}")
    return out
