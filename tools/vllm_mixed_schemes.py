#!/usr/bin/env python
"""What vLLM 0.32 gives each Llama linear of a ModelOpt MIXED_PRECISION checkpoint, without building the model.

Run with the .venv-vllm python; imports nothing from the repo's ``repair`` package.

    vllm_mixed_schemes.py DIR [DIR ...]

For each DIR, one JSON line: {"dir": DIR, "layers": {vLLM prefix: {"method": class, "scheme": weight key class |
null, "activation": activation key class | null} | {"error": "<Type>: <message>"}}}. Per prefix it calls vLLM's own
``ModelOptMixedPrecisionConfig.get_quant_method(layer, prefix)`` (config from config.json's quantization_config, the
Llama ``packed_modules_mapping`` vLLM sets) with an uninitialised instance of the layer class vLLM's Llama builds
there (QKVParallelLinear, MergedColumnParallelLinear, RowParallelLinear): the linear branch only tests the class and
reads the prefix. So a scheme whose kernel does not exist on this host fails here exactly as in a real load.
The CPU NVFP4 emulation kernel is registered first, as tools/vllm_load.py does.
"""

from __future__ import annotations

import json
import sys

from vllm_runtime import emit
from raised_by import reraise_ours

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
LINEARS = {"self_attn.qkv_proj": "QKVParallelLinear", "self_attn.o_proj": "RowParallelLinear",
           "mlp.gate_up_proj": "MergedColumnParallelLinear", "mlp.down_proj": "RowParallelLinear"}


def name_of(obj) -> str | None:
    return None if obj is None else type(obj).__name__


def schemes(folder: str) -> dict:
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig

    with open(f"{folder}/config.json") as fh:
        config = json.load(fh)
    cfg = ModelOptMixedPrecisionConfig.from_config(config["quantization_config"])
    cfg.packed_modules_mapping = PACKED
    out = {}
    for i in range(config["num_hidden_layers"]):
        for sub, cls in LINEARS.items():
            prefix = f"model.layers.{i}.{sub}"
            layer = getattr(linear, cls).__new__(getattr(linear, cls))
            try:
                method = cfg.get_quant_method(layer, prefix)
            except Exception as err:  # noqa: BLE001 - the runtime's own refusal is the result
                reraise_ours(err)
                out[prefix] = {"error": f"{type(err).__name__}: {err}"}
                continue
            out[prefix] = {"method": name_of(method), "scheme": name_of(getattr(method, "wkey", None)),
                           "activation": name_of(getattr(method, "akey", None))}
    return {"dir": folder, "layers": out}


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for folder in argv:
        emit(schemes(folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
