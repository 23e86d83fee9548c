#!/usr/bin/env python
"""What vLLM's own code makes of exclusion lists for a class: its ModelOpt NVFP4 config handed the class's mapper the
way the loader hands it (run in the release's venv; tests/vllm/test_entry_mappers_vs_vllm.py).

    vllm_entry_mapper_probe.py REQUEST.json        REQUEST: {arch: {"modelopt": [entries], "compressed-tensors": [..],
                                                           "mixed": {key: quant_algo}}}

One JSON line per arch: {"arch", "mapper": whether the class has one, "modelopt": the exclude_modules list after
vLLM's rewrite, "compressed-tensors": the ignore list after it, "mixed": a ModelOpt MIXED_PRECISION config's
quantized_layers after it, as [key, quant_algo] pairs in its order (ModelOptMixedPrecisionConfig.apply_vllm_mapper)}. The rewrite is vLLM's: configure_quant_config
(model_loader/utils.py:361-381) for a class that is not SupportsQuant, SupportsQuant._maybe_apply_model_mapping
(interfaces.py:1253-1260) for one that is, each on a config read by the config class's own from_config. Only the
class's own mapper is asked (the profile records the build's, inner modules' included: the test compares where they
are one). Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

from vllm_gpu_stand_ins import cuda_classes
from vllm_runtime import emit, torchvision_stand_in


def rewrite(model_class, config):
    from vllm.model_executor.model_loader.utils import configure_quant_config
    from vllm.model_executor.models.interfaces import SupportsQuant

    if issubclass(model_class, SupportsQuant):
        SupportsQuant._maybe_apply_model_mapping(SimpleNamespace(quant_config=config,
                                                                 hf_to_vllm_mapper=model_class.hf_to_vllm_mapper))
    else:
        configure_quant_config(config, model_class)
    return config


def main(argv: list[str]) -> int:
    from vllm import ModelRegistry
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig, ModelOptNvFp4Config

    torchvision_stand_in()  # as the profile: a class importing torchvision at module level imports
    request = json.loads(open(argv[0]).read())
    for arch, lists in request.items():
        model_class = cuda_classes(arch).get(arch, ModelRegistry._try_load_model_cls(arch))  # the profile's class
        modelopt = ModelOptNvFp4Config.from_config({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                                    "ignore": list(lists["modelopt"])})
        ct = CompressedTensorsConfig.from_config({
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": list(lists["compressed-tensors"]),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
                "dynamic": False}, "input_activations": {"num_bits": 4, "type": "float", "strategy": "tensor_group",
                                                         "group_size": 16, "symmetric": True, "dynamic": "local"}}}})
        mixed = ModelOptMixedPrecisionConfig.from_config({
            "quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {k: {"quant_algo": a, "group_size": 16} for k, a in lists.get("mixed", {"x": "NVFP4"}).items()}})
        emit({"arch": arch, "mapper": getattr(model_class, "hf_to_vllm_mapper", None) is not None,
              "modelopt": rewrite(model_class, modelopt).exclude_modules,
              "compressed-tensors": rewrite(model_class, ct).ignore,
              "mixed": [[k, v["quant_algo"]] for k, v in rewrite(model_class, mixed).quantized_layers.items()]})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
