#!/usr/bin/env python
"""What vLLM decides for every module of a checkpoint: built quantized, or built unquantized, and why.

Run with the .venv-vllm python (tools/vllm_env.sh); imports nothing from the repo's ``repair`` package.

    vllm_declared.py DIR [DIR ...]

For each DIR, one JSON line on stdout, in the order given:

    {"dir": DIR, "ok": true, "architecture": "...", "quant_config": "ModelOptNvFp4Config",
     "modules": {checkpoint module: {"vllm_module": "...", "prefix": "...", "layer": "QKVParallelLinear",
                                     "method": "ModelOptNvFp4LinearMethod" | "UnquantizedLinearMethod" | null,
                                     "quantized": bool, "model": "main" | "mtp"}},
     "unplaced": [checkpoint modules vLLM's load_weights put nowhere]}
    {"dir": DIR, "ok": false, "error_type": "...", "error": "..."}

How (everything is vLLM 0.32's own code; the shims are listed below):
  * ``EngineArgs(model=DIR).create_engine_config()`` reads the checkpoint's quantization config the way
    ``vllm serve`` does (hf_quant_config.json / config.json ``quantization_config`` -> ``VllmConfig.quant_config``,
    e.g. ``ModelOptNvFp4Config.from_config`` / ``CompressedTensorsConfig.from_config``).
  * ``initialize_model`` builds the architecture's real model class on the meta device: it applies the class's
    ``hf_to_vllm_mapper`` and ``packed_modules_mapping`` to the quant config (``configure_quant_config`` /
    ``SupportsQuant``) and every layer asks the quant config for its method with the prefix the model class
    gives it (``get_quant_method(layer, prefix)``: exclusions, fused-shard rules, config-group targets). Layers
    the model class builds with ``quant_config=None`` (routers, some towers) never ask. Each module's
    ``quant_method`` is the decision: a method whose class name starts with "Unquantized" (or none) = unquantized.
  * Which vLLM module a checkpoint module becomes is vLLM's own ``model.load_weights`` (weights mapper, stacked
    q/k/v and gate/up params, expert params mapping, skipped names), run on meta tensors of the checkpoint's
    shapes and dtypes (read from the safetensors headers) with every parameter's weight loader replaced by a
    recorder: nothing is loaded, only "checkpoint tensor -> vLLM parameter" is recorded.
  * Models with MTP layers (``num_nextn_predict_layers``): the main model skips them; they are placed and decided
    by the MTP draft model vLLM builds for ``speculative_config={"method": "mtp"}`` (e.g. DeepSeekMTP), on the
    same checkpoint.
Shims (no decision logic): ``register_linear_kernel(EmulationNvFp4LinearKernel, CPU, "nvfp4")`` so NVFP4 linears
can be constructed on CPU (stock 0.32 has CUDA/ROCm kernels only; as tools/vllm_probe.py), NVFP4 MoE methods
falling back to vLLM's EMULATION kernel backend when its backend selection finds none for CPU, the CPU runner's
``_set_torch_accelerator_to_noop()``, a ``torchvision`` stand-in for importing gemma4_mm.py and the folder's
architectures inspected in this process (tools/vllm_runtime.py ``torchvision_stand_in``, ``inspect_in_process``), a
world-size-1 gloo process group, and the recording weight loaders.
"""

from __future__ import annotations

import gc
import json
import math
import os
import struct
import sys
import traceback

from vllm_runtime import (emit, enable_cpu_nvfp4, inspect_in_process, kernel_stand_ins,
                          nvfp4_moe_emulation_fallback, torchvision_stand_in, world_of_one)

# the tensor that names a module's stored weight, in each format
WEIGHT_LEAVES = ("weight", "weight_packed")
DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "U8": "uint8", "I8": "int8",
          "F8_E4M3": "float8_e4m3fn", "I32": "int32", "I64": "int64"}


def log(msg: str) -> None:
    print(f"[vllm_declared] {msg}", file=sys.stderr, flush=True)


def header_weights(folder: str) -> dict[str, tuple[str, list[int]]]:
    """Checkpoint module -> (its weight tensor's name, shape, dtype) from the safetensors headers."""
    out = {}
    for file in sorted(f for f in os.listdir(folder) if f.endswith(".safetensors")):
        with open(os.path.join(folder, file), "rb") as fh:
            size = struct.unpack("<Q", fh.read(8))[0]
            header = json.loads(fh.read(size))
        for name, entry in header.items():
            module, _, leaf = name.rpartition(".")
            if name != "__metadata__" and leaf in WEIGHT_LEAVES:
                out[module] = (name, entry["shape"], DTYPES[entry["dtype"]])
    return out


def setup() -> None:
    enable_cpu_nvfp4()
    nvfp4_moe_emulation_fallback()
    torchvision_stand_in()
    kernel_stand_ins()


def placements(model, weights: dict, loaded: set | None = None) -> dict[str, dict]:
    """Checkpoint module -> the vLLM module its weight is loaded into, by the model's own load_weights (`loaded`, if
    given, gets the parameter names load_weights reports loaded, what vLLM's track_weights_loading checks)."""
    import torch

    owner = {}
    for mod_name, mod in model.named_modules():
        for p_name, p in mod.named_parameters(recurse=False):
            owner.setdefault(id(p), (mod_name, mod))  # tied weights: the first module (embed_tokens)
    current = {"name": None}
    placed: dict[str, tuple[str, object]] = {}

    def recorder(param):
        def record(*args, **kwargs):
            loaded = args[1] if len(args) > 1 else kwargs.get("loaded_weight")
            name = getattr(loaded, "_ckpt_name", None) or current["name"]
            if name is not None and id(param) in owner:
                placed.setdefault(name, owner[id(param)])
            return True  # FusedMoE's return_success
        return record

    def copier(param):  # a class that copies into the parameter itself (gpt_oss.py's 3-D experts: `param.copy_`)
        def copy_(src, *args, **kwargs):
            recorder(param)(param, src)
            return param
        return copy_

    for _, p in model.named_parameters():
        if hasattr(type(p), "weight_loader") and isinstance(type(p).weight_loader, property):
            p._weight_loader = recorder(p)
        else:
            p.weight_loader = recorder(p)
        p.copy_ = copier(p)
    for _, b in model.named_buffers():  # AutoWeightsLoader loads persistent buffers too (`_add_loadable_non_param_tensors`)
        b.weight_loader = meta_copy(b)

    def tensors():
        for module, (name, shape, dtype) in weights.items():
            # a scalar (an NVFP4 weight_scale_2, input_scale) on CPU: mllama4.py:1214 broadcasts one to every expert
            # with `.item()`, which a meta tensor refuses (a limit of ours, not vLLM's); any such read raised before
            t = torch.zeros(shape, dtype=getattr(torch, dtype), device="meta" if math.prod(shape) > 1 else "cpu")
            t._ckpt_name = module
            current["name"] = module
            yield name, t

    reported = model.load_weights(tensors())
    if loaded is not None:
        loaded.update(reported or ())
    out = {}
    for module, (mod_name, mod) in placed.items():
        method = getattr(mod, "quant_method", None)
        method_name = type(method).__name__ if method is not None else None
        out[module] = {"vllm_module": mod_name, "prefix": getattr(mod, "prefix", None), "layer": type(mod).__name__,
                       "method": method_name,
                       "quantized": method_name is not None and not method_name.startswith("Unquantized")}
    return out


def meta_copy(buffer):
    """A buffer's loader: vLLM's default_weight_loader (its size check) into a meta stand-in of the buffer, so a
    CPU-built model's buffer (Apertus's xIELU beta/eps: built on the CPU, it reads them with .item()) is not handed our
    meta tensor to copy ("Cannot copy out of meta tensor": the harness's, no refusal of vLLM's). Not recorded as placed,
    as a meta-built model's buffer never was."""
    def load(param, loaded_weight, *args, **kwargs):
        import torch
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        default_weight_loader(torch.empty_like(buffer, device="meta"), loaded_weight)
    return load


def build(vc, model_config):
    import torch
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import initialize_model

    with set_current_vllm_config(vc), torch.device("meta"):
        return initialize_model(vc, model_config=model_config)


def decide(folder: str) -> dict:
    from vllm.engine.arg_utils import EngineArgs

    with open(os.path.join(folder, "config.json"), encoding="utf-8") as f:
        config = json.load(f)
    mtp = bool(config.get("num_nextn_predict_layers"))
    inspect_in_process(config.get("architectures"))
    args = dict(model=os.path.abspath(folder), skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128,
                enforce_eager=True, load_format="dummy")
    if mtp:
        args["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 1}
    vc = EngineArgs(**args).create_engine_config()
    weights = header_weights(folder)
    log(f"{folder}: {vc.model_config.architectures} quant={type(vc.quant_config).__name__} mtp={mtp}")
    result = {"architecture": vc.model_config.architectures[0], "quant_config": type(vc.quant_config).__name__}
    with world_of_one(vc):
        modules = {k: dict(v, model="main") for k, v in placements(build(vc, vc.model_config), weights).items()}
        if mtp:
            draft = vc.speculative_config.draft_model_config
            for k, v in placements(build(vc, draft), weights).items():
                modules.setdefault(k, dict(v, model="mtp"))
    result["modules"] = dict(sorted(modules.items()))
    result["unplaced"] = sorted(set(weights) - set(modules))
    return result


def main(argv: list[str]) -> int:
    try:
        setup()
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return 3
    for folder in argv:
        try:
            line = {"dir": folder, "ok": True, **decide(folder)}
        except Exception as e:
            traceback.print_exc(file=sys.stderr)
            line = {"dir": folder, "ok": False, "error_type": type(e).__name__, "error": str(e)}
        gc.collect()
        emit(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
