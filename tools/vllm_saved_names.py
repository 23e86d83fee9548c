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
    transformers class writes: a parameter of dim > 2 is FusedMoE's w13/w2, whose weight loader takes one expert per
    tensor. A row learned from no names would record no prefixes, renames or refusals and read as healthy."""
    if any(p.dim() > 2 for p in model.parameters()):
        raise NoConfig(NO_LAYOUT)


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
