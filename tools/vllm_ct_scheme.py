#!/usr/bin/env python
"""Which compressed-tensors scheme vLLM picks for each folder's qkv_proj, and whether it is weight-only (.venv-vllm).

    vllm_ct_scheme.py DIR [DIR ...]   ->  one JSON line per DIR: {"dir", "scheme": class name, "use_a16": bool}

vLLM 0.32's own `CompressedTensorsConfig.from_config(config.json quantization_config).get_scheme(layer, prefix)`
decides. One shim, kernel choice only: a weight-only NVFP4 scheme forces the Marlin kernel in its __init__, which
this CPU host does not have; `init_nvfp4_linear_kernel` failing is answered with None so the decision (the scheme
object, its `use_a16`) can be read. Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import sys

from vllm_runtime import emit


def main(argv: list[str]) -> int:
    from vllm.model_executor.layers import linear
    from vllm.model_executor.layers.quantization.compressed_tensors import compressed_tensors as ct
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import compressed_tensors_w4a4_nvfp4 as w4a4

    real = w4a4.init_nvfp4_linear_kernel

    def kernel_or_none(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except ValueError:
            return None

    w4a4.init_nvfp4_linear_kernel = kernel_or_none
    for folder in argv:
        with open(f"{folder}/config.json", encoding="utf-8") as f:
            config = ct.CompressedTensorsConfig.from_config(json.load(f)["quantization_config"])
        layer = linear.QKVParallelLinear.__new__(linear.QKVParallelLinear)
        scheme = config.get_scheme(layer, "model.layers.1.self_attn.qkv_proj")
        emit({"dir": folder, "scheme": type(scheme).__name__, "use_a16": bool(getattr(scheme, "use_a16", False))})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
