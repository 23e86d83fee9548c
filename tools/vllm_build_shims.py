"""Shims and guards tools/vllm_profile.py needs around each build of a model: the layer vLLM's NVFP4 method refuses,
triton's missing allocator on this CPU build, and a class's packed mappings restored between builds. Run in .venv-vllm;
imports nothing from ``repair``."""

from __future__ import annotations

import contextlib

from vllm_load_facts import pattern


def refused_layer(error: ValueError) -> str | None:
    """The name pattern of the layer whose shape vLLM's NVFP4 method refuses (in features not a multiple of 16: a
    4-wide Gemma 3n AltUp linear), from the innermost frame building one; None for any other error. Every NVFP4
    export vLLM loads must exclude it, so the profile excludes it too (recorded as `nvfp4_refused`)."""
    if "not multiple of 16" not in str(error):
        return None
    found, tb = None, error.__traceback__
    while tb is not None:
        prefix = tb.tb_frame.f_locals.get("prefix")
        found = prefix if isinstance(prefix, str) and prefix else found
        tb = tb.tb_next
    return None if found is None else pattern(found)


def no_triton_allocator() -> None:
    """Shim: the CPU build's triton has no set_allocator, which linear-attention layers call at construction
    (vllm/triton_utils/allocation.py) to give kernels scratch memory; no layer's quant method depends on it."""
    from vllm.triton_utils import triton

    if not hasattr(triton, "set_allocator"):
        triton.set_allocator = lambda alloc_fn: None


@contextlib.contextmanager
def class_mappings_kept(arch: str):
    """Every packed_modules_mapping its model class and its bases hold as class attributes, restored after profiling
    `arch`: DeepseekV2ForCausalLM.__init__ adds to its class's own dict (deepseek_v2.py:1899-1911: qkv_proj for a
    config without MLA), which DeepseekForCausalLM and MistralLarge3ForCausalLM share. vLLM builds one model per
    process; the profile builds many, and one build's additions must not become another class's fused layers."""
    from vllm import ModelRegistry

    model_class = ModelRegistry._try_load_model_cls(arch)
    kept = {id(d): (d, dict(d)) for c in getattr(model_class, "__mro__", ())
            if isinstance(d := c.__dict__.get("packed_modules_mapping"), dict)}

    def reset() -> None:
        for mapping, before in kept.values():
            mapping.clear()
            mapping.update(before)
    try:
        yield reset  # called again before another build of the class (tools/vllm_variants.py)
    finally:
        reset()
