#!/usr/bin/env python
"""Profile vLLM's registered architectures from vLLM's own model code: what each layer is built as (run in .venv-vllm).

    vllm_profile.py OUT.json [--only ARCH ...]

For every architecture of vLLM's text-generation registry, and every *ForConditionalGeneration class of its
multimodal one (built whole: language model, towers and projector; their sub-configs shrunk too, and a build vLLM
refuses on that config is only `unprofiled`, never `build_refused`), a small config (tools/vllm_profile_configs.py; learned
from vLLM's own model code where the config class comes with remote code only: tools/vllm_remote_configs.py) is
written to a temp folder with a ModelOpt NVFP4 `quantization_config` that excludes nothing, vLLM reads it as
`vllm serve` does (`EngineArgs(...).create_engine_config()`), and the architecture's model class is built on the
meta device (`initialize_model`, which also hands the class's `packed_modules_mapping` and `hf_to_vllm_mapper` to
the quant config). Every module holding a 2-D weight is recorded under its name pattern (layer numbers -> `*`):
  "quantized"   its quant_method is a quantized one (the quant config quantizes it);
  "unquantized" an Unquantized* method (the quant config was asked and declined: embeddings, ...);
  "none"        no quant_method: built without the quant config (quant_config=None, or a plain torch Linear).
Also: the class's packed_modules_mapping (fused layers) and what its hf_to_vllm_mapper does to each checkpoint
weight name transformers' own model class gives the config (name patterns); and `load_refused`, vLLM's error where its
loader takes no BF16 checkpoint of transformers' names at all (tools/vllm_load_refused.py); and `modelopt_fp4_only`,
the layers built unquantized under ModelOpt's NVFP4 config alone (tools/vllm_format_states.py); and
`exclusion_mappers`, the mappers the build hands its quant config to rewrite its lists with (tools/vllm_exclusion_mappers.py); and which listed name
of a config the release builds (`registry`, `transformers_fallback`, `unsupported`, `retired`, `malformed`, `suffixes`:
tools/vllm_registry.py); and, for a row built two ways (`without`), the modules only the full build loads
(`loads_only_with`: tools/vllm_without_loads.py) and which null fields and values its config loading refuses
(`partly_null_refused`, `value_refused`: tools/vllm_config_refusals.py); and `build_refused`, the architectures whose
build vLLM's own code refuses on the small config (its error, the line that raised it, and the field it refuses), told apart from those this
host cannot build (an `unprofiled` reason either way). The output is data for repair/targets/data/ (tools/vllm_profile_write.py formats it). Imports nothing from ``repair``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import tempfile
import time
import traceback
from typing import Callable

from vllm_runtime import (Loader, enable_cpu_nvfp4, kernel_stand_ins, nvfp4_moe_emulation_fallback,
                          torchvision_stand_in, world_of_one)
from vllm_profile_configs import (PUBLISHED, MAPPER_LAYOUT, VALUE_RULES, WITHOUT, NoConfig, model_types, small_config,
                                  written_as)
from vllm_remote_configs import LEARNED
from vllm_config_refusals import null_refused, refusal_condition, refusal_site, value_refused
from vllm_layer_facts import layer_rules, where_rules
from vllm_variants import refusal_lifted, variants
from vllm_format_states import modelopt_fp4_only
from vllm_without_loads import loads_only_with
from vllm_load_refused import load_refused
from vllm_missing_weights import missing_weights
from vllm_registry import registry_facts
from vllm_gpu_stand_ins import CPU_IMPLEMENTATION, cpu_implementation, cuda_classes
from vllm_mapper_inverse import renaming_maps
from vllm_null_lists import null_exclusions_refused
from vllm_drafters import has_mtp, mtp_drafter, register_drafters
from vllm_ct_sparsity import ct_sparsity_refused
from vllm_mixed_keys import modelopt_mixed_keys
from vllm_nested_algos import modelopt_nested_refused
from vllm_fused_exclusions import all_fused_exclusions
from vllm_expert_scales import experts_gate_up_scale_2
from vllm_exclusion_mappers import recorded
from vllm_expert_refusals import expert_refusals
from vllm_build_shims import class_mappings_kept, no_triton_allocator, refused_layer  # noqa: F401 (importers of both)
from vllm_load_facts import (log, load_renames, nvfp4_refusals, pattern, placed_weights, quant_prefixes,
                             record_asked_prefixes, renames)
from vllm_dropped import dropped_tensors, loader_drops, mapper_drops
from vllm_saved_names import (NO_LAYOUT, UNBUILT, checkpoint_names, own_checkpoint, own_names_layout,  # noqa: F401
                              published_checkpoint, saved_tensors, saved_weights, transformers_model)  # (UNBUILT, saved_tensors, ...: imported from here too)
from raised_by import reraise_ours

# no KV-cache scheme: older releases' CPU attention refuses an FP8 KV cache at these head sizes, and no linear depends on it
QUANTIZATION = {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": [], "group_size": 16}


def state_of(module) -> str:
    method = getattr(module, "quant_method", None)
    if method is None:
        return "none"
    return "unquantized" if type(method).__name__.startswith("Unquantized") else "quantized"


def modules_of(model) -> dict[str, dict]:
    """Weight-bearing module pattern -> {"state", "layer"} (states that differ across layers are all kept)."""
    out: dict[str, dict] = {}
    for name, module in model.named_modules():
        weight = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        fused_moe = hasattr(module, "w13_weight")
        if not fused_moe and (weight is None or weight.dim() != 2):
            continue
        entry = out.setdefault(pattern(name), {"states": [], "layer": type(module).__name__})
        state = state_of(module)
        if state not in entry["states"]:
            entry["states"].append(state)
    return {k: {"state": "|".join(sorted(v["states"])), "layer": v["layer"]} for k, v in sorted(out.items())}


def build_model(folder: str, initialize_model, drafter: bool = False, mappers: list | None = None):
    """(model, its VllmConfig): on the meta device (no prefix caching: on CPU vLLM turns it off for MLA models after
    its hybrid hook sized the mamba blocks for it, and then refuses its own config); a class whose __init__ copies data (buffers filled from tensors)
    is built again on CPU, from a fresh config (layer names register once per config), a few MB at these sizes.
    `drafter`: the MTP draft model vLLM builds for `speculative_config={"method": "mtp"}` on this checkpoint instead.
    `mappers`: the recorded apply_vllm_mapper calls, emptied before each build (a failed meta build's calls are not
    the build vLLM makes: Apertus's XIELU calls .item() and recorded its one call twice)."""
    import contextlib

    import torch
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs

    for device in ("meta", None):
        if mappers is not None:
            mappers.clear()
        vc = EngineArgs(model=folder, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128, enforce_eager=True,
                        load_format="dummy", trust_remote_code=False,
                        enable_prefix_caching=False,
                        speculative_config={"method": "mtp", "num_speculative_tokens": 1} if drafter else None
                        ).create_engine_config()
        model_config = vc.speculative_config.draft_model_config if drafter else vc.model_config
        try:
            with world_of_one(vc), set_current_vllm_config(vc), torch.device(device) if device else contextlib.nullcontext():
                return initialize_model(vc, model_config=model_config), vc
        except (NotImplementedError, RuntimeError) as e:  # e.g. "Tensor.item() cannot be called on meta tensors"
            if device is None or "meta tensor" not in str(e):
                raise
    raise AssertionError("unreachable")


def profile(arch: str, names: dict[str, str], loader: Loader, small: tuple[dict, str, dict],
            reset: Callable[[], None] = lambda: None) -> dict:
    import transformers
    from vllm import ModelRegistry
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    config, source, deciding = small  # small_config's, read before vLLM registers its own config class for the model type
    model_class = ModelRegistry._try_load_model_cls(arch)
    if model_class is None:
        raise NoConfig("vLLM cannot import its model class here (a GPU-only or missing dependency)")
    try:
        model_class = cuda_classes(arch).get(arch, model_class)  # the class a GPU builds, where the package picks per platform
    except ValueError as e:  # the package's platform choice cannot be read: nothing here says what a GPU builds
        raise NoConfig(f"{cpu_implementation(model_class) or CPU_IMPLEMENTATION}: {e}") from None
    if cpu_implementation(model_class):
        raise NoConfig(cpu_implementation(model_class))
    ModelRegistry.register_model(arch, model_class)  # in-process: no inspection subprocess per architecture
    refused: list[str] = []
    while True:
        with tempfile.TemporaryDirectory() as folder:
            write_config(folder, arch, config, refused)
            try:
                with recorded([]) as mappers:  # what the build hands its quant config to rewrite its lists with
                    model, vc = build_model(folder, initialize_model, mappers=mappers)
                mtp = mtp_drafter(folder, initialize_model) if has_mtp(config) else {}
                break
            except ValueError as e:
                layer = refused_layer(e)
                if layer is None or layer in refused:
                    raise
                refused.append(layer)
    if not hasattr(transformers, written_as(arch)):  # no class writes its checkpoint: vLLM's own names are the only layout
        own_names_layout(model)
    # a config learned from vLLM's own code (remote code only): the checkpoint is vLLM's own names, fused layers as the
    # shards its load_weights stacks, under the names its mapper renames from (own_names_layout checked it takes them
    # all), and the facts are learned from it; likewise for a config class vLLM ships where no transformers class
    # writes names and its mapper renames (Step3p5), and where transformers' names are not the published ones
    # (MAPPER_LAYOUT: DeepSeek-V4's native names are vLLM's own read back through its mapper)
    learned = source.startswith(LEARNED) or arch in MAPPER_LAYOUT or (
        not hasattr(transformers, written_as(arch)) and renaming_maps(getattr(type(model), "hf_to_vllm_mapper", None)))
    own = published_checkpoint(built_from(arch, config, False)[0]) if learned else None
    packed = {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}
    extra = {"nvfp4_refused": refused} if refused else {}
    fused = {k: v for k, v in sorted(packed.items()) if v != [k]}
    modules = modules_of(model)
    export = dict(config, **PUBLISHED.get(arch, {}))
    with world_of_one(vc), set_current_vllm_config(vc):
        tensors = saved_tensors(arch, export) if own is None else {n: (shape, "bfloat16") for n, shape in own.items()}
        weights = saved_weights(tensors)
        placed, unplaced = placed_weights(model, weights)
        refusals = nvfp4_refusals(model, weights, placed, tensors)
        dropped, raised = dropped_tensors(model, {n: (n, *kind) for n, kind in tensors.items()})
    layers = export_layer_rules(arch, model if export == config else None, tensors, export, refused)
    prefixes, loads = quant_prefixes(model, placed, fused), load_renames(model, placed, fused)
    refused_load = load_refused(arch, names, loader, config, own if arch in MAPPER_LAYOUT else None)
    without = built_without(arch, config, refused, (model, vc), tensors)
    nvfp4_only = modelopt_fp4_only(arch, config, refused, modules, build_model, state_of)
    drafter_only = modelopt_fp4_only(arch, config, refused, mtp["mtp"].get("modules", {}), build_model, state_of,
                                     drafter=True) if mtp else []
    mtp = {"mtp": dict(mtp["mtp"], modelopt_fp4_only=drafter_only)} if drafter_only else mtp
    agrees = {"agrees_with": deciding} if deciding else {}  # a config.json setting another value builds other layers
    row = {"config": {"source": source, "model_type": config.get("model_type"), **agrees}, **extra,
           "quant_config": type(vc.quant_config).__name__, "modules": modules, "fused": fused,
           "renames": renames(type(model), checkpoint_names(transformers_model(arch, export, "meta"))) if own is None
           else {**renames(type(model), sorted(weights)), **mapper_drops(type(model)), **loader_drops(model)},
           **({"prefixes": prefixes} if prefixes else {}), **({"loads_into": loads} if loads else {}),
           **({"nvfp4_load_refused": refusals} if refusals else {}), **({"dropped": dropped} if dropped else {}),
           **({"weight_refused": unplaced} if unplaced else {}), **tensors_refused(unplaced, raised),
           **({"dropped_in_layers": layers} if layers else {}), **mtp,
           **({"load_refused": refused_load} if refused_load else {}), **({"without": without} if without else {}),
           **({"modelopt_fp4_only": nvfp4_only} if nvfp4_only else {}),
           **({"exclusion_mappers": mappers} if mappers else {})}
    varied = variants(arch, config, row, lambda c: built_facts(arch, c, refused, reset), log)  # last: it builds again
    return {**row, **({"variants": varied} if varied else {})}


def tensors_refused(modules: dict[str, str], tensors: dict[str, str]) -> dict:
    """{"tensors_refused": tensor pattern -> vLLM's error} where load_weights raised on a tensor of transformers'
    save fed with its module's others (dropped_tensors) and no `weight_refused` module holds it; {} where none. Facts of
    the small config's build, which doctor does not read: they may hang on fields a published config sets otherwise
    (DeepSeek-V3's e_score_correction_bias is a parameter only with topk_method noaux_tc, deepseek_v2.py:327-332)."""
    kept = {k: v for k, v in tensors.items() if not any(k.startswith(m + ".") for m in modules)}
    return {"tensors_refused": kept} if kept else {}


def built_facts(arch: str, config: dict, refused: list[str], reset: Callable[[], None]) -> dict:
    """{"modules", "fused"[, "mtp", "weight_refused"]} of vLLM's build of `config` (tools/vllm_variants.py; its MTP
    drafter's build where the config has MTP layers, as the profile records it; what its load_weights raises on NVFP4
    experts it stacks in parameters of its own: tools/vllm_expert_refusals.py), its class's packed mappings as before
    the profiled build (`reset`: DeepSeek-V2's __init__ adds fused_qkv_a_proj to its class's own dict) and after."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    reset()
    try:
        with tempfile.TemporaryDirectory() as folder:
            write_config(folder, arch, config, refused)
            model, vc = build_model(folder, initialize_model)
            mtp = mtp_drafter(folder, initialize_model) if has_mtp(config) else {}
        packed = {k: list(v) for k, v in (getattr(model, "packed_modules_mapping", None) or {}).items()}
        with world_of_one(vc), set_current_vllm_config(vc):
            raised = expert_refusals(model)  # stacked experts of the loader's own names (MiniCPMMoE's ws / w2s)
        return {"modules": modules_of(model), "fused": {k: v for k, v in sorted(packed.items()) if v != [k]}, **mtp,
                **({"weight_refused": raised} if raised else {})}
    finally:
        reset()


def built_without(arch: str, config: dict, refused: list[str], built: tuple, tensors: dict) -> dict:
    """{"fields", "modules", "loads_only_with", "refused_only_with", "partly_null_refused", "value_refused"}: vLLM's model built again with WITHOUT's fields null (another attention
    class), when its modules differ from the profiled build's (`built`: (model, VllmConfig)); {} otherwise. With the
    checkpoint modules of transformers' export (`tensors`) the profiled build loads and this one does not."""
    from vllm.model_executor.model_loader.utils import initialize_model

    fields = WITHOUT.get(arch)
    if not fields:
        return {}
    with tempfile.TemporaryDirectory() as folder:
        write_config(folder, arch, {**config, **dict.fromkeys(fields)}, refused)
        other, other_vc = build_model(folder, initialize_model)
    modules = modules_of(other)
    if modules == modules_of(built[0]):
        return {}
    only, refusals = loads_only_with(*built, other, other_vc, tensors)
    partly = null_refused(write_config, arch, config, refused, fields)
    values = value_refused(write_config, arch, config, refused, VALUE_RULES.get(arch, ()))
    return {"fields": list(fields), "modules": modules, **({"loads_only_with": only} if only else {}),
            **({"refused_only_with": refusals} if refusals else {}), **({"partly_null_refused": partly} if partly else {}),
            **({"value_refused": values} if values else {})}


def said_by(e: BaseException) -> str:
    """The error as data: its type and first 200 characters, the name of our run's temp folder (random) taken out."""
    text = re.sub(re.escape(tempfile.gettempdir()) + r"/tmp\w+", "<the small config's folder>", str(e))
    return f"{type(e).__name__}: {text[:200]}"


def builds(arch: str, config: dict) -> bool:
    """Whether vLLM builds `arch` from `config` (on the meta device, as the profile does)."""
    error = attempt(arch, config)
    if error is not None:
        log(f"{arch}: not built without the refused field ({type(error).__name__}: {str(error)[:160]})")
    return error is None


def attempt(arch: str, config: dict) -> BaseException | None:
    """The exception vLLM's build of `arch` from `config` raises (on the meta device, as the profile builds), or None."""
    from vllm.model_executor.model_loader.utils import initialize_model

    with tempfile.TemporaryDirectory() as folder:
        write_config(folder, arch, config, [])
        try:
            build_model(folder, initialize_model)
        except Exception as e:  # noqa: BLE001 - any failure: it does not build
            reraise_ours(e)
            return e
    return None


def write_config(folder: str, arch: str, config: dict, refused: list[str]) -> None:
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(dict(config, architectures=[arch],  # a variant's quantization fields (vllm_variants.py) added
                       quantization_config=dict(QUANTIZATION, **(config.get("quantization_config") or {}), ignore=refused),
                       torch_dtype="bfloat16"), f)


def small_llama(quantized: bool, names: dict[str, str]):
    """(model, VllmConfig): LlamaForCausalLM on the small config, under the profile's quantization config or none."""
    return built_from("LlamaForCausalLM", small_config("LlamaForCausalLM", names)[0], quantized)


def built_from(arch: str, config: dict, quantized: bool):
    """(model, VllmConfig) of `arch` on `config`, under the profile's quantization config or none (BF16 parameters:
    the shapes a checkpoint stores)."""
    from vllm.model_executor.model_loader.utils import initialize_model

    with tempfile.TemporaryDirectory() as folder:
        write_config(folder, arch, config, [])
        if not quantized:
            with open(os.path.join(folder, "config.json"), "w") as f:
                json.dump(dict(config, architectures=[arch], torch_dtype="bfloat16"), f)
        return build_model(folder, initialize_model)


def export_layer_rules(arch: str, model, tensors: dict, export: dict, refused: list[str]) -> dict:
    """tools/vllm_layer_facts.py's per-layer drops on the export's config (vLLM's model built again when the export's
    PUBLISHED fields change it: Gemma 3n's KV-shared layers exist only with them): first/last runs and per-layer lists
    (DeepSeek-V4's compress_ratios)."""
    from vllm.model_executor.model_loader.utils import initialize_model

    def rebuild(config: dict):
        with tempfile.TemporaryDirectory() as folder:
            write_config(folder, arch, config, refused)
            return build_model(folder, initialize_model)[0]

    try:
        built = model if model is not None else rebuild(export)
        return {**where_rules(built, tensors, export, rebuild), **layer_rules(built, tensors, export, rebuild)}
    except Exception as e:  # noqa: BLE001 - vLLM refuses the export's config here: no per-layer facts
        reraise_ours(e)
        log(f"{arch}: no per-layer facts ({type(e).__name__}: {str(e)[:120]})")
        return {}


def main(argv: list[str]) -> int:
    out_path, only = argv[0], argv[argv.index("--only") + 1:] if "--only" in argv else None
    import vllm
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS, _TEXT_GENERATION_MODELS

    generation = sorted(a for a in _MULTIMODAL_MODELS if a.endswith("ForConditionalGeneration"))
    enable_cpu_nvfp4()
    nvfp4_moe_emulation_fallback()
    torchvision_stand_in()
    kernel_stand_ins()
    no_triton_allocator()
    record_asked_prefixes()
    register_drafters()
    loader = Loader(False)
    names = model_types()
    archs = sorted(only or {*_TEXT_GENERATION_MODELS, *generation})
    result = {"runtime": "vllm", "release": vllm.__version__.split("+")[0], "quantization": QUANTIZATION,
              "missing_weights": missing_weights(lambda quantized: small_llama(quantized, names)),
              "null_exclusions_refused": null_exclusions_refused(),
              "modelopt_nested_refused": modelopt_nested_refused(),
              "ct_sparsity_refused": ct_sparsity_refused(),
              "modelopt_mixed_keys": modelopt_mixed_keys(),
              "fused_exclusions": all_fused_exclusions(),
              "experts_gate_up_scale_2": experts_gate_up_scale_2(),
              "load_refused_checked": True,  # every row says whether vLLM loads any checkpoint of it (`load_refused`)
              "registered": len(_TEXT_GENERATION_MODELS), "registered_multimodal": len(generation), "architectures": {}, "unprofiled": {}, "build_refused": {}}
    for arch in archs:
        t0 = time.perf_counter()
        small: tuple[dict, str, dict] = ({}, "", {})
        try:
            with class_mappings_kept(arch) as reset:
                small = small_config(arch, names)
                result["architectures"][arch] = profile(arch, names, loader, small, reset)
        except NoConfig as e:  # a config learned from vLLM's own code (remote code only) says so: no class ships one
            result["unprofiled"][arch] = str(e) + (f" ({LEARNED}: its class comes with remote code)"
                                                   if small[1].startswith(LEARNED) else "")
        except Exception as e:  # noqa: BLE001 - recorded as the reason; vLLM's own refusal also as a fact (`refused`)
            reraise_ours(e)
            traceback.print_exc(file=sys.stderr)
            # a multimodal class's towers are shrunk by size keys alone: vLLM refusing that config is no fact about
            # the configs published (Glm4v's vision heads left at 12 for a width of 64), so never a `build_refused`
            said, site = said_by(e), None if arch in generation else refusal_site(e)
            result["unprofiled"][arch] = (f"vLLM refuses the config transformers writes for it ({site}): {said}" if site
                                          else f"vLLM cannot build it from the small config: {said}")
            if site:
                when = refusal_condition(small[0], e, lambda c, a=arch: builds(a, c))
                unless = refusal_lifted(small[0], e, site, lambda c, a=arch: attempt(a, c), refusal_site)
                result["build_refused"][arch] = {"error": said, "raised_at": site, **({"when": when} if when else {}),
                                                 **({"unless": unless} if unless else {})}
        log(f"{arch}: {'ok' if arch in result['architectures'] else result['unprofiled'][arch][:100]} ({time.perf_counter() - t0:.1f} s)")
    refused = {k: v for k, v in [("build_refused", result.pop("build_refused"))] if v}  # only where one is refused
    rows = {k: result.pop(k) for k in ("architectures", "unprofiled")}  # last: transformers' whole model zoo imported
    result |= registry_facts() | refused | rows
    with open(out_path, "w") as f:
        json.dump(result, f, indent=1, sort_keys=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
