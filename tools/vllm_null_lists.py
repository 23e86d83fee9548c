"""What vLLM's ModelOpt NVFP4 config reader does when the exclusion list it reads is null, per release (run in
.venv-vllm; tools/vllm_profile.py records it as the profile's `null_exclusions_refused`).

vLLM's own `ModelOptNvFp4Config.from_config` is called on the two forms it reads: config.json's flat
quantization_config (`"ignore": null`) and the nested form of hf_quant_config.json (`quantization.exclude_modules:
null`, also read from a config.json quantization_config holding a `quantization` block). The error it raises, the
same for both, is recorded under the quantization name it registers; a release that reads a null list without
raising records nothing. Imports nothing from ``repair``.
"""

from __future__ import annotations

FLAT = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": None}
NAME = "modelopt_fp4"  # the quantization name vLLM registers the reader under
NESTED = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                                             "group_size": 16, "exclude_modules": None}}


def null_exclusions_refused() -> dict[str, str]:
    """{"modelopt_fp4": "<the error vLLM raises>"} if from_config raises on both forms, else {}."""
    from vllm.model_executor.layers.quantization import get_quantization_config
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    assert get_quantization_config(NAME) is ModelOptNvFp4Config, NAME
    errors = set()
    for config in (FLAT, NESTED):
        try:
            ModelOptNvFp4Config.from_config({**config})
        except (ValueError, TypeError) as exc:
            errors.add(f"{type(exc).__name__}: {exc}")
        else:
            errors.add(None)
    if len(errors) != 1:
        raise SystemExit(f"vLLM reads a null list differently per form: {sorted(map(str, errors))}; record both")
    error = errors.pop()
    return {} if error is None else {NAME: error}


if __name__ == "__main__":
    import json

    print(json.dumps(null_exclusions_refused()))
