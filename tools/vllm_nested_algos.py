"""Which ModelOpt quant_algo vLLM refuses in the nested form hf_quant_config.json writes, per release (run in
.venv-vllm; tools/vllm_profile.py records it as the profile's `modelopt_nested_refused`).

ModelOpt's hf_quant_config.json is `{"producer": {"name": "modelopt"}, "quantization": {"quant_algo": ...}}`; vLLM
reads it when config.json has no quantization_config (transformers_utils/config.py:888-899, 0.32), and also a
config.json quantization_config of that form. Before any quant config class sees it, vLLM 0.32's config reading
names its quant_method from the algo and raises on any other (transformers_utils/model_arch_config_convertor.py:263-290:
`Unknown ModelOpt quant algo`): every algo vLLM's ModelOpt configs list (modelopt.py QUANT_ALGOS) is run through that
code, and the error of each it refuses is recorded (None: read); an algo the list lacks is asked too, and where that is
refused its error is recorded as the rule for every other algo ("*"). 0.28 and 0.30 run the same step; a release without
it stops the tool (its reading is not known here: no guess). Imports nothing from ``repair``.
"""

from __future__ import annotations

from types import SimpleNamespace

OTHER = "NOT_A_MODELOPT_ALGO"  # an algo no list names: what the config reading does with every algo its list lacks


def modelopt_nested_refused() -> dict[str, str]:
    """quant_algo -> the error vLLM's config reading raises on the nested form declaring it, None where it reads it;
    "*": its error (`*` the algo as written) on any algo its list does not name (ModelOpt's NVFP4_AWQ); {} where none."""
    from vllm.model_executor.layers.quantization.modelopt import QUANT_ALGOS

    try:
        from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase
    except ImportError:  # a release before 0.28's config reading: where it names the quant_method is not read here
        raise SystemExit("vLLM has no transformers_utils/model_arch_config_convertor.py: read where this release names "
                         "the nested form's quant_method (tools/vllm_nested_algos.py)") from None
    normalize = ModelArchConfigConvertorBase._normalize_quantization_config
    out: dict[str, str | None] = {}
    for algo in (*QUANT_ALGOS, OTHER):
        nested = {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": algo}}
        try:
            normalize(None, SimpleNamespace(quantization_config=nested))
            out[algo] = None
        except ValueError as exc:
            out[algo] = f"{type(exc).__name__}: {exc}"
    other = out.pop(OTHER)
    return {**out, "*": other.replace(OTHER, "*")} if other and OTHER in other else {a: e for a, e in out.items() if e}


if __name__ == "__main__":
    import json

    print(json.dumps(modelopt_nested_refused()))
