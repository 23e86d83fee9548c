#!/usr/bin/env python
"""Which compressed-tensors config group a runtime's own CompressedTensorsConfig gives each linear layer.

    ct_groups_probe.py vllm|sglang CASES.json   ->  one JSON line: {case: {prefix: answer}}

Run with the runtime's venv python (.venv-vllm / .venv-sglang); imports nothing from ``repair``. CASES.json is
{case: {"quantization_config": {...}, "packed": {fused: [shards]}, "prefixes": [...], "classes": {prefix: class}}}.
Per prefix the runtime's own ``CompressedTensorsConfig.from_config(quantization_config)`` (packed_modules_mapping set
as the model class sets it) answers ``get_scheme_dict(layer, prefix)`` for an uninitialised instance of the layer's
linear class (its matching reads only the class name): the answer is the matched scheme's ``weights`` fields and
whether it has input activations, or null (built unquantized), or {"error": "<Type>: <message>"} where the runtime
raises (SGLang's "Unable to find matching target").
"""

from __future__ import annotations

import json
import os
import sys
from raised_by import reraise_ours


def _config_class(runtime: str):
    if runtime == "vllm":
        from vllm.model_executor.layers import linear
        from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    else:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tools import sglang_runtime  # noqa: F401  (SGLang's GPU-only imports stubbed)
        from sglang.srt.layers import linear
        from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    return CompressedTensorsConfig, linear


def answer(config, layer, prefix: str):
    try:
        found = config.get_scheme_dict(layer, prefix)
    except Exception as exc:  # noqa: BLE001 - the runtime's own refusal is the answer
        reraise_ours(exc)
        return {"error": f"{type(exc).__name__}: {exc}"}
    if not found or found.get("weights") is None:
        return None
    weights = found["weights"]
    return {"weights": {k: getattr(weights, k, None) for k in ("num_bits", "type", "strategy", "group_size", "block_structure")},
            "input_activations": found.get("input_activations") is not None}


def main(argv: list[str]) -> int:
    runtime, path = argv
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the runtime's logs go to stderr
    config_class, linear = _config_class(runtime)
    with open(path, encoding="utf-8") as fh:
        cases = json.load(fh)
    result = {}
    for name, case in cases.items():
        config = config_class.from_config(json.loads(json.dumps(case["quantization_config"])))
        config.packed_modules_mapping = case["packed"]
        answers = {}
        for prefix in case["prefixes"]:
            cls = getattr(linear, case["classes"].get(prefix, "RowParallelLinear"))
            answers[prefix] = answer(config, cls.__new__(cls), prefix)
        result[name] = answers
    out.write(json.dumps(result, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
