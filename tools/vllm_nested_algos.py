"""Which ModelOpt quant_algo vLLM refuses in the nested form hf_quant_config.json writes, per release (run in
.venv-vllm; tools/vllm_profile.py records it as the profile's `modelopt_nested_refused`).

ModelOpt's hf_quant_config.json is `{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ...}}`; vLLM
reads it when config.json has no quantization_config (transformers_utils/config.py:888-899, 0.32), and also a
config.json quantization_config of that form. Before any quant config class sees it, vLLM 0.32's config reading
names its quant_method from the algo and raises on any other (transformers_utils/model_arch_config_convertor.py:263-290:
`Unknown ModelOpt quant algo`): every algo vLLM's ModelOpt configs list (modelopt.py QUANT_ALGOS) is run through that
code, and the error of each it refuses is recorded. A release without that step records nothing. Imports nothing from
``repair``.
"""

from __future__ import annotations

from types import SimpleNamespace


def modelopt_nested_refused() -> dict[str, str]:
    """quant_algo -> the error vLLM's config reading raises on the nested form declaring it ({} where none)."""
    from vllm.model_executor.layers.quantization.modelopt import QUANT_ALGOS

    try:
        from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    except ImportError:  # an older release: the quant config classes read the nested form themselves
        return {}
    normalize = ModelArchConfigConvertorBase._normalize_quantization_config
    out = {}
    for algo in QUANT_ALGOS:
        nested = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo}}
        try:
            normalize(None, SimpleNamespace(quantization_config=nested))
        except ValueError as exc:
            out[algo] = f"{type(exc).__name__}: {exc}"
    return out


if __name__ == "__main__":
    import json

    print(json.dumps(modelopt_nested_refused()))
