"""Load a checkpoint into SGLang's own model with its own `load_weights`, on CPU, and trace where each tensor went.

Runs in .venv-sglang. The model is built by tools/sglang_runtime.py on the CPU (tiny checkpoints only), then
SGLang's `model.load_weights(iter(checkpoint tensors))` runs unchanged. Every parameter's weight loader is
wrapped (the same loader is still called, with the same arguments) to record which checkpoint tensor
reached which parameter, recognised by object identity: SGLang hands the tensor it read to the loader.
A parameter without a `weight_loader` attribute gets SGLang's `default_weight_loader`, which is what its
load loops fall back to (`getattr(param, "weight_loader", default_weight_loader)`).
"""

from __future__ import annotations

import hashlib
import time
import traceback
from pathlib import Path

import torch

from tools import sglang_runtime as runtime


def _digest(t: torch.Tensor) -> str:
    flat = t.detach().contiguous().reshape(-1)
    return hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()


def checkpoint_tensors(path: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for shard in sorted(Path(path).glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def _shard_id(args: tuple, kwargs: dict):
    """The shard id a fused layer's weight loader was given (QKV: "q"/"k"/"v", merged column: 0, 1, ...), else None."""
    found = args[2] if len(args) > 2 else kwargs.get("loaded_shard_id", kwargs.get("shard_id"))
    return found if isinstance(found, (str, int)) and not isinstance(found, bool) else None


def _trace(model, by_id: dict[int, str], routes: dict[str, list[str]], shard_ids: dict | None = None) -> None:
    from sglang.srt.model_loader.weight_utils import default_weight_loader

    shard_ids = {} if shard_ids is None else shard_ids

    for pname, param in model.named_parameters():
        loader = getattr(param, "weight_loader", None) or default_weight_loader

        def traced(*args, _loader=loader, _pname=pname, **kwargs):
            loaded = args[1] if len(args) > 1 else kwargs.get("loaded_weight")
            tensor = by_id.get(id(loaded), "?")
            routes.setdefault(tensor, []).append(_pname)
            if (shard := _shard_id(args, kwargs)) is not None:
                shard_ids[tensor] = shard
            return _loader(*args, **kwargs)

        if hasattr(param, "_weight_loader"):  # BasevLLMParameter: weight_loader is a read-only property
            param._weight_loader = traced
        else:
            param.weight_loader = traced


def owners(model) -> dict[str, str]:
    """Parameter name -> the prefix of the module that owns it."""
    out = {}
    for prefix, module in model.named_modules():
        for leaf, _ in module.named_parameters(recurse=False):
            out[f"{prefix}.{leaf}" if prefix else leaf] = prefix
    return out


def _merged(layers: dict, owners: dict, routes: dict, unrouted: set[str]) -> dict[str, str]:
    """Unrouted tensors a model merged before loading: a shard of a fused layer (its "fused" names) one of whose
    parameters received a tensor that is no checkpoint tensor (DeepSeek concatenates q_a_proj and
    kv_a_proj_with_mqa into fused_qkv_a_proj_with_mqa). Tensor -> that layer."""
    fed = {owners.get(p) for p in routes.get("?", [])}
    out = {}
    for name in sorted(unrouted):
        module, _, _ = name.rpartition(".")
        parent, _, leaf = module.rpartition(".")
        for prefix in fed:
            layer = layers.get(prefix) or {}
            if prefix and prefix.rpartition(".")[0] == parent and leaf in (layer.get("fused") or ()):
                out[name] = prefix
    return out


def _one_by_one(path: str, tensors: dict[str, torch.Tensor], routes: dict[str, list[str]], shard_ids: dict) -> dict[str, str]:
    """After a failed load: a fresh model, each tensor given to load_weights alone, so that every tensor's own
    route and error are known (the whole load stops at the first). Tensors a model merges before loading
    (DeepSeek's q_a_proj + kv_a_proj_with_mqa) are not loaded this way; their layer is still in "layers"."""
    model, _ = runtime.build(path, device="cpu")
    routes.clear()
    _trace(model, {id(t): name for name, t in tensors.items()}, routes, shard_ids)
    errors = {}
    for name, tensor in tensors.items():
        try:
            model.load_weights(iter([(name, tensor)]))
        except Exception as exc:
            errors[name] = f"{type(exc).__name__}: {exc}"
    return errors


def load(path: str, digests: bool = False) -> dict:
    """{"ok", "layers", "routes": {checkpoint tensor: [params]}, "shard_ids": {checkpoint tensor: the shard id its
    fused layer's loader was given}, "merged": {tensor: fused layer it was merged into
    before loading}, "skipped": [tensors no loader received, merged or not],
    "owners", "params" (with `digests`: shape, dtype, sha256, all_zero of every parameter after loading), or the error;
    after a failed load also "errors": {tensor: "Type: message"} from loading each tensor alone}."""
    started = time.time()
    line: dict = {"dir": path}
    try:
        model, quant_config = runtime.build(path, device="cpu")
    except Exception as exc:
        traceback.print_exc()
        return line | {"ok": False, "stage": "build", "error_type": type(exc).__name__, "error": str(exc),
                       "seconds": round(time.time() - started, 2)}
    packed = getattr(quant_config, "packed_modules_mapping", None) or {}
    line.update(quant_config=type(quant_config).__name__, architecture=type(model).__name__,
                packed={k: list(v) for k, v in packed.items() if isinstance(v, (list, tuple))},
                layers=runtime.layers(model, quant_config), owners=owners(model))
    tensors = checkpoint_tensors(path)
    routes: dict[str, list[str]] = {}
    shard_ids: dict[str, str | int] = {}
    _trace(model, {id(t): name for name, t in tensors.items()}, routes, shard_ids)
    try:
        model.load_weights(iter(tensors.items()))
    except Exception as exc:
        traceback.print_exc()
        line.update(ok=False, stage="load", error_type=type(exc).__name__, error=str(exc))
        line["errors"] = _one_by_one(path, tensors, routes, shard_ids)
    else:
        line["ok"] = True
    merged = _merged(line["layers"], line["owners"], routes, set(tensors) - set(routes))
    line.update(routes=routes, shard_ids=shard_ids, merged=merged, skipped=sorted(set(tensors) - set(routes) - set(merged)))
    if digests:
        line["params"] = {n: {"shape": list(p.shape), "dtype": str(p.dtype).removeprefix("torch."),
                              "sha256": _digest(p), "all_zero": not bool(p.detach().ne(0).any())}
                          for n, p in model.named_parameters()}
    line["seconds"] = round(time.time() - started, 2)
    return line
