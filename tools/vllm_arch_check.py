#!/usr/bin/env python
"""A tiny NVFP4 export per profiled architecture, and what vLLM does with it (run in .venv-vllm).

    vllm_arch_check.py ROOT ARCH [ARCH ...] [--set FIELDS.json]

--set: fields written over every export's config (a build the profile records as a row's `variants`,
tools/vllm_variants.py: DeepSeek-V2 with q_lora_rank null).

For each ARCH, one JSON line on stdout, in the order given:

    {"arch": ARCH, "ok": true, "names_from": "transformers" | "vllm", "healthy": DIR, "broken": DIR,
     "broken_module": "...", "broken_kind": "router" | "excluded", "declared": {checkpoint module: vLLM builds it quantized (bool)},
     "unplaced": [checkpoint modules vLLM's load_weights put nowhere], "healthy_load": LOAD, "broken_load": LOAD}
    {"arch": ARCH, "ok": false, "why": "..."}                    (no checkpoint could be written for it)
Each line also has "built": the class vLLM built (the one a CUDA host builds where the model package picks per
platform: tools/vllm_gpu_stand_ins.py cuda_classes, as the profile), and "stand_in_calls": every call into a stand-in (torchvision, FlashAttention: tools/vllm_runtime.py)
while its checkpoints were built, judged and loaded; each raised, so a result that reached one is not vLLM's own.
LOAD = {"ok": bool, "error_type": ..., "error": ...}: vLLM's own loader on CPU (tools/vllm_load.py's path, weights
tracked), the real weights of the folder. When the healthy export does not load, "bf16_load" says whether vLLM loads
transformers' own BF16 checkpoint of the same model (if not, vLLM loads no checkpoint of it: the tier compares its error
with the profile's `load_refused`, which tools/vllm_load_refused.py records the same way).

The checkpoint: the profile's small config (tools/vllm_profile_configs.py, plus its PUBLISHED fields where
transformers' class and vLLM's file build different layers from the same config); the tensor names and shapes are what
transformers' own model class for it writes with ``save_pretrained`` (its conversion mapping reversed: per-expert names
where transformers reverts its fused experts, the published names it renames; tied lm_head dropped), i.e. the names a
ModelOpt export of that model has. Where vLLM's load_weights refuses those names, transformers' own names (the
mapping's renamings applied forward) are written instead, if vLLM takes them. Where transformers has no class (a
config class only vLLM ships: ChatGLM; or one learned from vLLM's own code where the config comes with remote code:
tools/vllm_remote_configs.py), vLLM's own parameter names are written ("names_from": "vllm"), each fused layer as the
shards its packed_modules_mapping names and each routed expert as its layer's expert mapping names it
(tools/vllm_saved_names.py own_checkpoint), under the names its hf_to_vllm_mapper renames from where it renames
(published_checkpoint: Mistral Large 3's `layers.N.attention.wq_a`). Which module is stored
NVFP4 (ModelOpt's leaves: packed uint8 ``weight``, FP8 ``weight_scale`` per 16, FP32 ``weight_scale_2`` and
``input_scale``) is vLLM's own decision under an exclude-nothing ModelOpt config (tools/vllm_declared.py's
``decide``); every other module it places is listed in hf_quant_config.json's ``exclude_modules`` (embeddings aside),
as ModelOpt writes it. The broken copy stores one more module packed that vLLM builds unquantized: a router vLLM
builds without a quant config (left out of the exclusions, as a quantize-all-linears export does), else a quantized
linear listed as excluded while still stored packed (the Gemma 4 assistant's case). Imports nothing from ``repair``.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import sys
import traceback

import vllm_declared
from vllm_declared import decide, setup
from vllm_gpu_stand_ins import cuda_classes
from vllm_load import load
from vllm_load_refused import bf16_export, export_config, transformers_names, write_tensors
from vllm_profile import QUANTIZATION, no_triton_allocator, refused_layer
from vllm_profile_configs import MAPPER_LAYOUT, model_types
from vllm_runtime import STAND_IN_CALLS, Loader, emit, reported

PRODUCER = {"name": "modelopt", "version": "0.33.0"}  # the hf_quant_config.json form of tests/data/real's exports
EMBEDDING = "Embedding"  # vLLM's embedding layer classes (VocabParallelEmbedding, ...): ModelOpt lists none
LM_HEAD = "lm_head"  # ModelOpt's default config never quantizes it (`*lm_head*` disabled) and always excludes it


def log(msg: str) -> None:
    print(f"[vllm_arch_check] {msg}", file=sys.stderr, flush=True)


def build_on_meta_else_cpu(vc, model_config):
    """tools/vllm_declared.py's meta-device build; a class whose __init__ copies data (buffers filled from tensors:
    Apertus, Bloom) is built on CPU instead (a few MB here), its layer names first unregistered from the config."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    try:
        return meta_build(vc, model_config)
    except (NotImplementedError, RuntimeError) as e:
        if "meta tensor" not in str(e):
            raise
    vc.compilation_config.static_forward_context.clear()
    with set_current_vllm_config(vc):
        return initialize_model(vc, model_config=model_config)


def quantize_all(probe: str, config: dict) -> dict:
    """vLLM's decision per module of the checkpoint in `probe` under the profile's quantize-everything config; a layer
    vLLM's NVFP4 method refuses to build (a 4-wide Gemma 3n AltUp linear) is excluded and the build retried, as the
    profile generator does (tools/vllm_profile.py's refused_layer): a ModelOpt export vLLM loads must exclude it."""
    refused: list[str] = []
    while True:
        with open(os.path.join(probe, "config.json"), "w") as f:
            json.dump(dict(config, quantization_config=dict(QUANTIZATION, ignore=refused)), f)
        try:
            return decide(probe)["modules"]
        except ValueError as e:
            layer = refused_layer(e)
            if layer is None or layer in refused:
                raise
            refused.append(layer)


def vllm_placed(probe: str, config: dict, tensors: dict) -> tuple[dict, dict]:
    """(vLLM's decision per module, the checkpoint's tensors) for transformers' published names, else for its own
    names where vLLM's load_weights refuses the published ones (the first error stands when both fail)."""
    try:
        return quantize_all(probe, config), tensors
    except Exception:
        renamed = transformers_names(config["model_type"], tensors)
        if set(renamed) == set(tensors):
            raise
        first = sys.exc_info()[1]
    write_tensors(probe, renamed)
    try:
        return quantize_all(probe, config), renamed
    except Exception as e:
        raise first from e


def nvfp4_leaves(module: str, weight) -> dict:
    """ModelOpt's NVFP4 leaves for a [out, in] weight (values are irrelevant to loading; shapes and dtypes are not).
    One scale_2 / input_scale value everywhere, so fused siblings agree as ModelOpt makes them."""
    import torch

    out_f, in_f = weight.shape
    gen = torch.Generator().manual_seed(len(module))
    return {f"{module}.weight": torch.randint(0, 256, (out_f, in_f // 2), dtype=torch.uint8, generator=gen),
            f"{module}.weight_scale": torch.ones(out_f, in_f // 16).to(torch.float8_e4m3fn),
            f"{module}.weight_scale_2": torch.tensor(0.01, dtype=torch.float32),
            f"{module}.input_scale": torch.tensor(0.02, dtype=torch.float32)}


def write_export(folder: str, config: dict, tensors: dict, packed: set[str], excluded: list[str]) -> str:
    from safetensors.torch import save_file

    os.makedirs(folder)
    out = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        out.update(nvfp4_leaves(module, t) if leaf == "weight" and module in packed else {name: t.contiguous()})
    save_file(out, os.path.join(folder, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=1)
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": sorted(set(excluded))}
    with open(os.path.join(folder, "hf_quant_config.json"), "w") as f:
        json.dump({"producer": PRODUCER, "quantization": quant}, f, indent=1)
    return folder


def broken_choice(placed: dict, tensors: dict, quantized: set[str]) -> tuple[str, str] | None:
    """(module, kind) to store packed where vLLM builds it unquantized: a layer vLLM builds unquantized even when the
    quant config excludes nothing (a router built with quant_config=None), else
    a quantized linear that is not one shard of a fused layer (its exclusion then stands alone), one whose prefix in
    vLLM is its checkpoint name where there is one."""
    def two_d(m):
        w = tensors.get(f"{m}.weight")
        return w is not None and w.dim() == 2 and w.shape[1] % 16 == 0

    routers = [m for m, v in placed.items() if not v["quantized"] and two_d(m) and EMBEDDING not in v["layer"]]
    if routers:
        return sorted(routers, key=lambda m: (m == LM_HEAD, m))[0], "router"
    alone = [m for m in quantized if placed[m]["vllm_module"].rpartition(".")[2] == m.rpartition(".")[2]]
    reached = [m for m in alone if placed[m].get("prefix") == m]  # vLLM matches an exclusion naming it (Gemma 3n's
    # altup_projections.N is built under model.self_decoder.: its exclusion reaches nothing, so storing it packed loads)
    return (sorted(reached or alone or quantized)[0], "excluded") if (alone or quantized) else None


def check(arch: str, root: str, names: dict, loader: Loader, fields: dict | None = None) -> dict:
    config = {**export_config(arch, names), **(fields or {})}
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", arch):  # a class name: it names a folder this tool removes
        raise ValueError(f"not an architecture name: {arch!r}")
    base = os.path.join(root, arch)
    shutil.rmtree(base, ignore_errors=True)
    probe = os.path.join(base, "bf16")
    try:
        if arch in MAPPER_LAYOUT:  # transformers' names are not the published ones (DeepSeek-V4: vLLM's own, read back)
            raise LookupError(arch)
        tensors, not_linear, names_from = *bf16_export(arch, config, probe), "transformers"
    except LookupError:  # no transformers class (a config class only vLLM ships): vLLM's own names
        tensors, not_linear, names_from = *vllm_own_export(config, probe), "vllm"
    placed, tensors = vllm_placed(probe, config, tensors)
    # the module vLLM loads into its lm_head is the LM head whatever the checkpoint calls it (Mistral's `output`), and
    # the exclusion that reaches it names vLLM's `lm_head` (the profile's prefixes: mistral_large_3.py maps
    # `output.weight`, not the entry `output`)
    head = {m for m, v in placed.items() if m == LM_HEAD or v["vllm_module"] == LM_HEAD}
    quantized = {m for m, v in placed.items() if v["quantized"] and tensors[f"{m}.weight"].dim() == 2 and m not in head
                 and m not in not_linear}
    excluded = [m for m, v in placed.items() if m not in quantized | head and EMBEDDING not in v["layer"]] + [LM_HEAD]
    healthy = write_export(os.path.join(base, "healthy"), config, tensors, quantized, excluded)
    decided = decide(healthy)
    declared = {m: v["quantized"] for m, v in decided["modules"].items()}
    choice = broken_choice(placed, tensors, quantized)
    line = {"arch": arch, "ok": True, "healthy": healthy, "declared": declared, "unplaced": decided["unplaced"],
            "names_from": names_from,
            "healthy_load": outcome(healthy, loader)}
    if not line["healthy_load"]["ok"]:  # does vLLM load transformers' own BF16 export of it at all?
        os.remove(os.path.join(probe, "config.json"))
        with open(os.path.join(probe, "config.json"), "w") as f:
            json.dump(config, f)
        line["bf16_load"] = outcome(probe, loader)
    shutil.rmtree(probe)
    if choice is not None:
        module, kind = choice
        still = [m for m in excluded if m != module] + ([module] if kind == "excluded" else [])
        broken = write_export(os.path.join(base, "broken"), config, tensors, quantized | {module}, still)
        line.update(broken=broken, broken_module=module, broken_kind=kind, broken_load=outcome(broken, loader))
    return line


def vllm_own_export(config: dict, folder: str) -> tuple[dict, set[str]]:
    """(name -> BF16 tensor, the modules that are no vLLM linear) of vLLM's own model for `config` built without a
    quantization config, saved in `folder`: the names its load_weights takes as its own (fused layers as their
    shards, routed experts one tensor per expert and shard), for an architecture whose published names come with
    remote code only (no transformers class writes them)."""
    import torch
    from vllm.model_executor.layers.linear import LinearBase
    from vllm.model_executor.model_loader.utils import initialize_model

    from vllm.config import set_current_vllm_config

    from vllm_profile import build_model, own_names_layout
    from vllm_runtime import world_of_one
    from vllm_saved_names import published_checkpoint

    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f)
    model, vc = build_model(folder, initialize_model)[:2]
    with world_of_one(vc), set_current_vllm_config(vc):  # DeepSeek-V4's load_weights asks the TP group
        own_names_layout(model)
    gen = torch.Generator().manual_seed(0)
    tensors = {n: (torch.randn(shape, generator=gen) / 16).to(torch.bfloat16) for n, shape in published_checkpoint(model).items()}
    write_tensors(folder, tensors)
    return tensors, {n for n, m in model.named_modules() if not isinstance(m, LinearBase)}


def outcome(folder: str, loader: Loader) -> dict:
    result = reported(folder, lambda: load(folder, loader), False, log)
    return {k: result.get(k) for k in ("ok", "error_type", "error")}


meta_build, vllm_declared.build = vllm_declared.build, build_on_meta_else_cpu  # decide() builds through it


def main(argv: list[str]) -> int:
    fields = {}
    if "--set" in argv:
        at = argv.index("--set")
        with open(argv[at + 1], encoding="utf-8") as f:
            fields = json.load(f)
        argv = argv[:at] + argv[at + 2:]
    root, archs = argv[0], argv[1:]
    try:
        setup()
        no_triton_allocator()
        loader = Loader(False)
        names = model_types()
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return 3
    from vllm import ModelRegistry

    for arch in archs:
        model_class = ModelRegistry._try_load_model_cls(arch)
        if model_class is not None:  # the class a GPU builds, where the package picks per platform (as the profile)
            model_class = cuda_classes(arch).get(arch, model_class)
            ModelRegistry.register_model(arch, model_class)  # in-process: no inspection subprocess per architecture
        calls = len(STAND_IN_CALLS)
        try:
            line = check(arch, root, names, loader, fields)
        except Exception as e:  # noqa: BLE001 - no checkpoint for it: the reason is the result
            traceback.print_exc(file=sys.stderr)
            line = {"arch": arch, "ok": False, "why": f"{type(e).__name__}: {str(e)[:300]}"}
        line["stand_in_calls"] = STAND_IN_CALLS[calls:]
        line["built"] = f"{model_class.__module__}.{model_class.__qualname__}" if model_class is not None else None
        gc.collect()
        log(f"{arch}: {'ok' if line['ok'] else line['why'][:120]}")
        emit(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
