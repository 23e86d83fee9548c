"""What a target runtime builds each layer as: BF16, or the scheme the checkpoint's own config selects for it.

Tokens: "nvfp4" (W4A4: packed weight, block scales, weight_scale_2, input_scale), "w4a16_nvfp4" (the
same without input_scale; vLLM drops a stored one), "fp8" (float8 weight [out, in], float32 weight_scale
and input_scale), "bf16" (unquantized). vLLM 0.32 (model_executor/layers/quantization/modelopt.py)
builds a linear through `LINEAR_ALGOS`; NVFP4_AWQ is not in that table, so under MIXED_PRECISION
`ModelOptMixedPrecisionConfig.get_quant_method` gives such a layer `UnquantizedLinearMethod` (and its
routed experts no method), and as a checkpoint's single quant_algo `from_config` refuses it.
"""

from __future__ import annotations

from repair.arch import Architecture, ModuleSpec
from repair.formats.base import Declaration
from repair.targets.profiles import Target

BUILT = {"NVFP4": "nvfp4", "W4A16_NVFP4": "w4a16_nvfp4", "FP8": "fp8", "FP8_BLOCK": "fp8_block"}  # declared algorithm -> what vLLM 0.32 builds
PACKED = frozenset({"nvfp4", "w4a16_nvfp4"})  # built with the packed NVFP4 parameters


def runtime_precision(specs: dict[str, ModuleSpec], declaration: Declaration, target: Target, family: Architecture) -> dict[str, str]:
    """What the target builds each linear as: BF16, or what the draft's own config declares for it
    (matched under the names the runtime gives the family's modules)."""
    out = {}
    for name, spec in specs.items():
        quantizable = spec.is_linear and spec.role not in ("embed",)
        follows = target.profile.follows_draft_config and declaration.quantized and quantizable
        out[name] = built(declared_algorithm(declaration, family, name)) if follows else "bf16"
    return out


def stored_precision(modules: list[str], declaration: Declaration, target: Target, family: Architecture) -> dict[str, str]:
    """What the target builds each stored quantized module as, for an architecture without a loader profile (no
    specs): the health checks that depend on it (a missing or broken activation scale) still apply."""
    follows = target.profile.follows_draft_config and declaration.quantized
    return {name: built(declared_algorithm(declaration, family, name)) if follows else "bf16" for name in modules}


def built(algorithm: str | None) -> str:
    """The scheme vLLM 0.32 builds for a declared algorithm (None: not quantized)."""
    return BUILT.get(algorithm or "", "bf16")


def declared_algorithm(declaration: Declaration, family: Architecture, module: str) -> str | None:
    """The algorithm the config declares for a checkpoint module, resolved as vLLM resolves its runtime layer.

    Under MIXED_PRECISION a shard of a layer the runtime fuses (q_proj of qkv_proj) is looked up as the
    fused layer, with the family's packed_modules_mapping, as vLLM builds and resolves it; otherwise the
    module's own runtime name is asked (exactly what `Declaration.excludes` has always been given); a shard of a
    merged layer is asked as that layer (`Architecture.asked_name`)."""
    runtime = family.asked_name(module)
    if declaration.layer_algos is None or ".experts." in runtime:
        return declaration.algorithm(runtime, family.fused_layers)
    parent, _, leaf = runtime.rpartition(".")
    fused = next((f for f, shards in family.fused_layers.items() if leaf in shards), None)
    return declaration.algorithm(f"{parent}.{fused}" if fused and parent else runtime, family.fused_layers)
