"""The weight-name mappers a class's build hands its quant config (run in the release's venv; tools/vllm_profile.py
records them as a row's `exclusion_mappers`).

vLLM rewrites the exclusion list with the class's hf_to_vllm_mapper before any layer asks it: initialize_model calls
configure_quant_config (model_loader/utils.py:361-381 in 0.32; get_rename_mapper there and in 0.30, the older
get_unstacked_mapper in 0.28), or a SupportsQuant model's __new__ does (interfaces.py:1253-1260 in 0.32), once per such
module it builds. ModelOpt's apply_vllm_mapper (modelopt.py:262-281 in 0.32, 256-275 in 0.30, 217-236 in 0.28) first
splits an entry `X*` (X not ending in `.`) into `X` and `X.*`, then maps the list (WeightsMapper.apply_list);
compressed-tensors' maps its `ignore` and targets that are layer paths (compressed_tensors.py:129-158 in 0.32), Fp8's
its `ignored_layers` (fp8.py:153-155). Whether a class has a mapper at all decides the ModelOpt split, so a class whose
mapper renames nothing is recorded too (`{}`), and a class with none records nothing.

Recorded by wrapping every quant config class's apply_vllm_mapper while the class is built, so what is recorded is
what the build did, mappers of inner SupportsQuant modules included, in call order. Each is written as its renaming
maps in the order WeightsMapper._map_name_with_shard applies them (checked from the release's own source by
vllm_mapper_inverse.forward_map): `regex`, `substr`, `stacked` (empty once get_rename_mapper drops it), `prefix`,
`suffix`, each a list of [old, new] (new null: the name is dropped). A mapper holding transformers' WeightRenaming
objects, or a regex with flags (the `regex` module's default VERSION0
and UNICODE aside: mistral_large_3.py compiles its maps with it), is not data this tool can write: it stops loudly. Imports nothing from ``repair``.
"""

from __future__ import annotations

import contextlib
import functools

from vllm_mapper_inverse import forward_map

KINDS = ("regex", "substr", "stacked", "prefix", "suffix")  # _map_name_with_shard's order, renaming aside


def mapper_data(mapper) -> dict:
    """One mapper's maps as data, in the order its release applies them."""
    forward_map(mapper)  # stops where this release's _map_name_with_shard applies its maps in another order
    if getattr(mapper, "orig_to_new_renaming", None):
        raise SystemExit(f"{type(mapper).__qualname__} holds orig_to_new_renaming (WeightRenaming objects), which "
                         "tools/vllm_exclusion_mappers.py cannot write as data: read this release's mapper anew")
    out = {}
    for kind in KINDS:
        maps = getattr(mapper, f"orig_to_new_{kind}", None) or {}
        pairs = []
        for old, new in maps.items():
            if kind == "regex":
                if old.flags & ~(32 | 0x2000):  # UNICODE: every str pattern's; 0x2000: the `regex` module's VERSION0
                    raise SystemExit(f"a regex map {old.pattern!r} with flags {old.flags}: not written as data")
                old = old.pattern
            if kind == "stacked":
                new = new[0]  # (the stacked name, its shard id): the name is what the list sees
            pairs.append([old, new])
        if pairs:
            out[kind] = pairs
    return out


def _quant_config_classes():
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors  # noqa: F401 - subclasses
    import vllm.model_executor.layers.quantization.fp8  # noqa: F401
    import vllm.model_executor.layers.quantization.modelopt  # noqa: F401
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    seen, todo = [], [QuantizationConfig]
    while todo:
        cls = todo.pop()
        seen.append(cls)
        todo.extend(c for c in cls.__subclasses__() if c not in seen)
    return [c for c in seen if "apply_vllm_mapper" in c.__dict__]


@contextlib.contextmanager
def recorded(into: list):
    """While inside: every mapper a quant config's apply_vllm_mapper is handed, appended to `into` as data (a
    subclass's call to its base's counts once)."""
    depth = [0]
    originals = {c: c.__dict__["apply_vllm_mapper"] for c in _quant_config_classes()}

    def wrap(original):
        @functools.wraps(original)
        def apply(self, mapper, *args, **kwargs):
            if depth[0] == 0:
                into.append(mapper_data(mapper))
            depth[0] += 1
            try:
                return original(self, mapper, *args, **kwargs)
            finally:
                depth[0] -= 1
        return apply

    for cls, original in originals.items():
        setattr(cls, "apply_vllm_mapper", wrap(original))
    try:
        yield into
    finally:
        for cls, original in originals.items():
            setattr(cls, "apply_vllm_mapper", original)
