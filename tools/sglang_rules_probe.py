"""SGLang 0.5.23's own answers to the questions a rules data file (repair/targets/data/sglang-*.json) answers.

Runs in .venv-sglang. `answers(cases)` returns, for each case, what SGLang's functions decide:
  * {"kind": "modelopt", "entries", "prefix", "layer": "linear"|"moe", "packed"}: a Linear / ParallelLMHead is BF16
    when `is_layer_skipped(prefix, entries, packed)` or `ModelOptFp4Config.is_layer_excluded(prefix)` (a FusedMoE
    only by the latter), exactly as `ModelOptQuantConfig._get_quant_method` asks them;
  * {"kind": "compressed-tensors", "entries", "prefix", "packed"}: `should_ignore_layer(prefix, entries, packed)`.
Each answer is "bf16", "quantized" or "error: <Type>: <message>" (a fused layer whose shards disagree).
`packed_mappings()`: architecture -> the `packed_modules_mapping` its registered model class declares.
"""

from __future__ import annotations

from tools import sglang_runtime  # noqa: F401  (stand-ins, environment)
from tools.raised_by import reraise_ours


def _modelopt(case: dict) -> bool:
    from sglang.srt.layers.quantization.modelopt_quant import ModelOptFp4Config
    from sglang.srt.layers.quantization.utils import is_layer_skipped

    config = ModelOptFp4Config(is_checkpoint_nvfp4_serialized=True, group_size=16, exclude_modules=list(case["entries"]),
                               packed_modules_mapping=case["packed"])
    if case["layer"] == "moe":
        return config.is_layer_excluded(case["prefix"])
    return is_layer_skipped(case["prefix"], config.exclude_modules, config.packed_modules_mapping) or \
        config.is_layer_excluded(case["prefix"])


def _compressed_tensors(case: dict) -> bool:
    from sglang.srt.layers.quantization.compressed_tensors.utils import should_ignore_layer

    return should_ignore_layer(case["prefix"], ignore=list(case["entries"]), fused_mapping=case["packed"])


def answers(cases: list[dict]) -> list[str]:
    decide = {"modelopt": _modelopt, "compressed-tensors": _compressed_tensors}
    out = []
    for case in cases:
        try:
            out.append("bf16" if decide[case["kind"]](case) else "quantized")
        except ValueError as exc:
            out.append(f"error: {type(exc).__name__}: {exc}")
    return out


def packed_mappings() -> dict[str, dict]:
    from sglang.srt.models.registry import ModelRegistry

    out = {}
    for arch in sorted(ModelRegistry.get_supported_archs()):
        try:
            cls = ModelRegistry.resolve_model_cls(arch)[0]
        except Exception as e:  # a model module that does not import here (CUDA-only kernels): not answerable
            reraise_ours(e)
            continue
        mapping = getattr(cls, "packed_modules_mapping", None)
        if mapping:
            out[arch] = {k: list(v) if isinstance(v, (list, tuple)) else v for k, v in mapping.items()}
    return out
