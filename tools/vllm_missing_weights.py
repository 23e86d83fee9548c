"""What vLLM's DefaultModelLoader does when a checkpoint leaves a layer's parameters unfilled, per release (run in
.venv-vllm; tools/vllm_profile.py records it as the profile's `missing_weights`).

vLLM's own `DefaultModelLoader.load_weights` is run on a small Llama built on the meta device, once quantized
(ModelOpt NVFP4) and once not, with the model's load_weights answering that it filled every parameter but one
layer's (a linear: `mlp.down_proj`; a norm: `input_layernorm`) and no tensors read: with the loader's defaults and
with `--model-loader-extra-config '{"enable_weights_track": true}'`. "refused": it raises its "Following weights
were not initialized from checkpoint" error; "unchecked": it goes on (the layer keeps uninitialised memory).
Imports nothing from ``repair``.
"""

from __future__ import annotations

from typing import Callable

UNFILLED = {"linear": "model.layers.0.mlp.down_proj.", "norm": "model.layers.0.input_layernorm."}
MODES = {"default": {}, "tracked": {"enable_weights_track": True}}
REFUSAL = "not initialized from checkpoint"


def missing_weights(build: Callable[[bool], tuple]) -> dict:
    """{"quantized" | "unquantized": {"default" | "tracked": {"linear" | "norm": "refused" | "unchecked"}}};
    build(quantized) -> (model, its VllmConfig)."""
    return {kind: outcomes(*build(kind == "quantized")) for kind in ("quantized", "unquantized")}


def outcomes(model, vc) -> dict:
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    params = {name for name, _ in model.named_parameters()}
    out: dict[str, dict[str, str]] = {}
    for mode, extra in MODES.items():
        loader = DefaultModelLoader(LoadConfig(model_loader_extra_config=dict(extra)))
        loader.get_all_weights = lambda *args: iter(())  # no file is read: the model answers what it filled
        for layer, prefix in UNFILLED.items():
            filled = {p for p in params if not p.startswith(prefix)}
            assert filled != params, f"the small Llama has no {prefix}"
            model.load_weights = lambda weights, filled=filled: set(filled)
            try:
                with set_current_vllm_config(vc):
                    loader.load_weights(model, vc.model_config)
                out.setdefault(mode, {})[layer] = "unchecked"
            except ValueError as e:
                if REFUSAL not in str(e):
                    raise
                out.setdefault(mode, {})[layer] = "refused"
    return out
