"""Whether a vLLM release rewrites a ModelOpt MIXED_PRECISION config's `quantized_layers` keys with the built class's
weight-name mapper (run in .venv-vllm; tools/vllm_profile.py records it as the profile's `modelopt_mixed_keys`).

vLLM hands the class's hf_to_vllm_mapper to its quant config before any layer asks (model_loader/utils.py:361-381 in
0.32); ModelOptMixedPrecisionConfig.apply_vllm_mapper maps the exclusion list and then the map's keys with
WeightsMapper.apply_dict (modelopt.py:1885-1888 in 0.32, 1811-1814 in 0.30, 2427-2430 in 0.28), so `_resolve_quant_algo`
reads keys in vLLM's spelling. The release's own config is read by its own from_config and handed a probe mapper that
renames one key, drops one and folds two into one: the keys it then holds are compared with apply_dict's (every key
mapped as a weight name, no `X*` split, a dropped key gone, two keys mapped alike one key at the first one's place with
the last one's value). {"mapped": "apply_dict", "at": file:line of its apply_vllm_mapper} where they are; {} where the
keys stay as written; any other rewrite stops the tool (this reader knows no other). Imports nothing from ``repair``.
"""

from __future__ import annotations

import inspect
import os

NVFP4, FP8 = {"quant_algo": "NVFP4", "group_size": 16}, {"quant_algo": "FP8"}
PROBE = {"a.layers.0.q_proj": NVFP4, "b.layers.0.o_proj": FP8, "drop.layers.0.fc": NVFP4, "c.layers.0.o_proj": NVFP4,
         "x.layers.0.k_proj*": NVFP4}
MAPPED = {"a.layers.0.q_proj": NVFP4, "b.layers.0.o_proj": NVFP4, "x.layers.0.k_proj*": NVFP4}  # apply_dict's answer


def modelopt_mixed_keys() -> dict[str, str]:
    """{"mapped": "apply_dict", "at": where} where the release maps quantized_layers keys; {} where it reads them as written."""
    from vllm.model_executor.layers.quantization.modelopt import ModelOptMixedPrecisionConfig
    from vllm.model_executor.models.utils import WeightsMapper

    config = ModelOptMixedPrecisionConfig.from_config({"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                                       "quantized_layers": dict(PROBE)})
    config.apply_vllm_mapper(WeightsMapper(orig_to_new_prefix={"drop.": None, "c.": "b."}))
    keys = getattr(config, "quantized_layers", None)
    if keys == PROBE:
        return {}
    if keys != MAPPED or list(keys) != list(MAPPED):
        raise SystemExit(f"ModelOptMixedPrecisionConfig.apply_vllm_mapper rewrites quantized_layers to {keys}, not as "
                         "WeightsMapper.apply_dict: read this release's rewrite (tools/vllm_mixed_keys.py)")
    method = ModelOptMixedPrecisionConfig.apply_vllm_mapper
    lines, first = inspect.getsourcelines(method)
    at = next(i for i, line in enumerate(lines) if "apply_dict" in line)
    path = inspect.getsourcefile(method)
    return {"mapped": "apply_dict", "at": f"{path[path.rindex(os.sep + 'vllm' + os.sep) + 1:]}:{first + at}"}


if __name__ == "__main__":
    import json

    print(json.dumps(modelopt_mixed_keys()))
