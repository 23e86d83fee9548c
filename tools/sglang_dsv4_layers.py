#!/usr/bin/env python
"""What SGLang 0.5.23's own quant config gives each layer of its own DeepSeek-V4 model (.venv-sglang; CPU, meta device).

    sglang_dsv4_layers.py PLAIN_DIR  ->  {"dir", "layers": {prefix: layer class}}: every layer that asks a quant method
    sglang_dsv4_layers.py --built QUANT_DIR  ->  {"dir", "quant_config", "layers": tools/sglang_runtime.layers()}: the
        model built with QUANT_DIR's own quant config (where no layer refuses it: DeepSeek-V4's published fp8 form)
    sglang_dsv4_layers.py PLAIN_DIR QUANT_DIR [QUANT_DIR ...]  ->  one JSON line per QUANT_DIR:
        {"dir", "quant_config": class, "layers": {prefix: {"class": layer class, "method": class or
         "<Type>: <message>" where get_quant_method raises, "strategy": the weights' strategy of a compressed-tensors scheme}}}

SGLang's DeepseekV4ForCausalLM cannot be built with a quant config that refuses one of its layers (the build stops at
the first), so the layers come from the model built from PLAIN_DIR (the same tiny config without quantization, by
SGLang's own constructor through tools/sglang_runtime.build), and each QUANT_DIR's quant config, made by SGLang's
loader (`_get_quantization_config`: from_config, packed_modules_mapping, the model's hf_to_sglang_mapper), is asked
`get_quant_method(layer, prefix)` for every layer that asks one: the call the constructor makes. One stand-in beyond
tools/sglang_runtime's: `get_device()` answers "cpu" (DeepSeek-V4's rotary embedding asks for an accelerator).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.raised_by import reraise_ours  # noqa: E402


def _answer(quant_config, module, prefix: str) -> dict:
    module.__dict__.pop("scheme", None)  # set by another folder's compressed-tensors config on the same module
    try:
        method = quant_config.get_quant_method(module, prefix)
    except Exception as exc:  # noqa: BLE001 - the runtime's own refusal is the answer
        reraise_ours(exc)
        return {"class": type(module).__name__, "method": f"{type(exc).__name__}: {exc}"}
    scheme = getattr(module, "scheme", None)
    name = type(scheme if scheme is not None and type(method).__name__.startswith("CompressedTensors") else method).__name__
    weights = getattr(scheme, "weight_quant", None)
    return {"class": type(module).__name__, "method": name, "strategy": str(getattr(weights, "strategy", "") or "") or None}


def cpu_rope() -> None:
    """The one stand-in beyond tools/sglang_runtime's: DeepSeek-V4's rotary embedding asks get_device() for an
    accelerator; it answers "cpu"."""
    import sglang.srt.layers.rotary_embedding.rope_variant as rope_variant
    import sglang.srt.utils.common as common

    rope_variant.get_device = common.get_device = lambda *args, **kwargs: "cpu"


def main(argv: list[str]) -> int:
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    from tools import sglang_runtime as runtime
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config

    cpu_rope()
    if argv[0] == "--built":  # the model built WITH the folder's quant config: each layer's method as its constructor chose
        model, quant_config = runtime.build(argv[1])
        out.write(json.dumps({"dir": argv[1], "quant_config": type(quant_config).__name__,
                              "layers": runtime.layers(model, quant_config)}) + "\n")
        return 0
    model, _ = runtime.build(argv[0])
    if len(argv) == 1:  # the layers alone: every prefix SGLang's constructor asks its quant config about, and its class
        layers = {prefix: type(module).__name__ for prefix, module in model.named_modules() if hasattr(module, "quant_method")}
        out.write(json.dumps({"dir": argv[0], "layers": layers}) + "\n")
    for folder in argv[1:]:
        runtime.setup(folder)
        quant_config = _get_quantization_config(ModelConfig(folder), LoadConfig())
        layers = {prefix: _answer(quant_config, module, prefix) for prefix, module in model.named_modules()
                  if hasattr(module, "quant_method")}
        out.write(json.dumps({"dir": folder, "quant_config": type(quant_config).__name__, "layers": layers}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
