#!/usr/bin/env python
"""Load plain checkpoint folders (a causal LM as ``vllm serve DIR`` would) with vLLM's own loader, on CPU.

Run with the .venv-vllm python (tools/vllm_env.sh); imports nothing from the repo's ``repair`` package. An EAGLE-3
draft folder is loaded the way ``vllm serve TARGET --speculative-config`` loads it (vLLM builds its model class only
inside a speculative config), beside a BF16 Llama target config of the draft's sizes; only the draft's weights are read.

    vllm_load.py DIR [DIR ...] [--hash] [--traceback] [--moe-emulation] [--global-scales]

For each DIR, one JSON line on stdout, in the order given:

    {"dir": DIR, "ok": true, "architecture": "LlamaForCausalLM", "quantization": "modelopt_fp4" | null,
     "params": {vLLM name: {"dtype": "uint8", "shape": [..], "sha256": ".."}}, "buffers": {...},
     "methods": {vLLM module: {"method": "ModelOptLinearMethod" | "UnquantizedLinearMethod" | ...,
                               "scheme": "KNvfp4Static" | null, "kernel": "EmulationNvFp4LinearKernel" | null}},
     "stand_in_calls": [], "load_s": seconds}
    {"dir": DIR, "ok": false, "error_type": "...", "error": "<str(exception), verbatim>", "stand_in_calls": [..],
     "load_s": seconds}

"params"/"buffers" are taken right before ``process_weights_after_loading`` (the tensors exactly as vLLM's weight
loaders wrote them; see tools/vllm_runtime.py), so "sha256" (with --hash) equals the sha256 of the checkpoint tensor
bytes each parameter was filled from (q/k/v and gate/up are concatenated along dim 0 in vLLM's fused parameters).
"methods" lists every module that has a ``quant_method``: what vLLM's quantization config decided for that layer.
With --global-scales, "global_scales" follows each NVFP4 linear's global scale through process_weights_after_loading:
{vLLM module: {"weight_scale_2": [per-shard values as loaded], "weight_global_scale": the one value the kernel is
given after processing, "weight_scale_sha256": [block scales' sha256 before, after]}} (a fused layer has one
weight_scale_2 entry per shard, and one global scale), and "expert_scales" each NVFP4 MoE layer's {vLLM module:
{"w13_weight_scale_2" (compressed-tensors: "w13_weight_global_scale", 1/scale): [[w1, w3] per expert, as loaded],
"w13_kept": [the one w13_weight_scale_2 per expert after processing]}}.

How: ``EngineArgs(model=DIR, dtype="bfloat16", max_model_len=128, enforce_eager=True,
skip_tokenizer_init=True).create_engine_config()`` (reads hf_quant_config.json / config.json's quantization_config as
``vllm serve`` does), then ``get_model`` (initialize the architecture's model class, load the weights with
``DefaultModelLoader``, process them) with ``enable_weights_track=True`` so a parameter the checkpoint never filled is
an error, in a gloo world of one. The CPU shims are tools/vllm_runtime.py's; ``--moe-emulation`` adds its NVFP4 MoE
fallback to vLLM's EMULATION backend (without it, vLLM 0.32's NVFP4 MoE backend selection has nothing for CPU).
Without torchvision in the venv, a stand-in (tools/vllm_runtime.py torchvision_stand_in) lets model files import that
reach it only through transformers' image processors (Gemma4ForConditionalGeneration), and the folder's architectures
are inspected in this process, where the stand-in is (``inspect_in_process``); "stand_in_calls" lists every call into
the stand-in during that folder's load (none: vLLM's own decisions). A model package that picks its CPU implementation
here (DeepSeek-V4) is loaded as the class a GPU builds (tools/vllm_gpu_stand_ins.py cuda_classes).
Exit 0 whenever every DIR produced a line; 3 when vLLM setup fails; 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from vllm_runtime import (STAND_IN_CALLS, Loader, emit, enable_cpu_nvfp4, kernel_stand_ins, inspect_in_process,
                          nvfp4_moe_emulation_fallback, reported, tensor_entry, torchvision_stand_in, tracked)


def log(msg: str) -> None:
    print(f"[vllm_load] {msg}", file=sys.stderr, flush=True)


def quant_methods(model) -> dict:
    """vLLM module name -> what its quantization config gave it: the quant method's class, the weight scheme (ModelOpt's
    ``wkey``, compressed-tensors' ``layer.scheme``) and the kernel the method chose, by class name (None if absent)."""
    def name_of(obj):
        return None if obj is None else type(obj).__name__

    return {"methods": {name: {"method": name_of(mod.quant_method),
                               "scheme": name_of(getattr(mod.quant_method, "wkey", None) or getattr(mod, "scheme", None)),
                               "kernel": name_of(getattr(mod.quant_method, "kernel", None))}
                        for name, mod in model.named_modules() if getattr(mod, "quant_method", None) is not None}}


# an NVFP4 MoE layer's [E, 2] per-expert (w1, w3) global scales as loaded: ModelOpt's, and compressed-tensors' (1/scale,
# which its method inverts into w13_weight_scale_2 after choosing a column)
EXPERT_SCALES = ("w13_weight_scale_2", "w13_weight_global_scale")


class GlobalScales:
    """The NVFP4 linears' per-shard weight_scale_2 and block-scale bytes as loaded (the Loader's snapshot, before
    process_weights_after_loading), and, after it, the one global scale and block-scale bytes each keeps; for an NVFP4
    MoE layer, its w13_weight_scale_2 (compressed-tensors: w13_weight_global_scale) as loaded ([expert][w1, w3]) and the
    w13_weight_scale_2 after processing (one value per expert)."""

    def __init__(self):
        self.before: dict = {}
        self.experts: dict = {}

    def snapshot(self, model) -> dict:
        self.before = {name: (mod, [float(v) for v in mod.weight_scale_2.detach().float().reshape(-1)],
                              tensor_entry(mod.weight_scale, True)["sha256"])
                       for name, mod in model.named_modules() if isinstance(getattr(mod, "weight_scale_2", None), torch_tensor())}
        self.experts = {name: (mod, attr, getattr(mod, attr).detach().float().tolist())
                        for name, mod in model.named_modules()
                        for attr in [next((a for a in EXPERT_SCALES if isinstance(getattr(mod, a, None), torch_tensor())), None)]
                        if attr is not None}
        return {}

    def after(self) -> dict:
        out = {name: {"weight_scale_2": scales, "weight_global_scale": float(getattr(mod, "weight_global_scale", float("nan"))),
                      "weight_scale_sha256": [sha, tensor_entry(mod.weight_scale, True)["sha256"]]}
               for name, (mod, scales, sha) in self.before.items()}
        experts = {name: {attr: loaded, "w13_kept": mod.w13_weight_scale_2.detach().float().reshape(-1).tolist()}
                   for name, (mod, attr, loaded) in self.experts.items()}
        self.before, self.experts = {}, {}
        return {"global_scales": out, "expert_scales": experts}


def torch_tensor():
    import torch

    return torch.Tensor


def load(folder: str, loader: Loader) -> dict:
    import os
    import tempfile

    from vllm.engine.arg_utils import EngineArgs

    from vllm_gpu_stand_ins import cuda_classes, reference_mla_backend

    args = dict(skip_tokenizer_init=True, dtype="bfloat16", max_model_len=128, enforce_eager=True, **reference_mla_backend())
    config = json.loads(open(os.path.join(folder, "config.json")).read())
    for arch in config.get("architectures") or []:  # the class a GPU builds where the package picked its CPU one here
        if isinstance(arch, str):
            cuda_classes(arch)
    inspect_in_process(config.get("architectures"))
    learned_config_registered(config)
    if not any(isinstance(a, str) and "Eagle3" in a for a in config.get("architectures") or []):
        vc = EngineArgs(model=os.path.abspath(folder), **args).create_engine_config()
        mc = vc.model_config
    else:  # vLLM builds an EAGLE-3 draft only inside a speculative config (llama_eagle3.py asserts one)
        with tempfile.TemporaryDirectory() as target:
            write_eagle3_target(config, target)
            spec = {"method": "eagle3", "model": os.path.abspath(folder), "num_speculative_tokens": 1}
            vc = EngineArgs(model=target, speculative_config=spec, **args).create_engine_config()
        mc = vc.speculative_config.draft_model_config
    log(f"{folder}: arch={mc.architectures} quantization={mc.quantization}")
    head = {"architecture": mc.architectures[0], "quantization": mc.quantization}
    return dict(head, **loader.load(vc, mc, tracked(vc.load_config)))


def learned_config_registered(config: dict) -> None:
    """Shim (no decision logic): a tiny export of a config learned from vLLM's own model code (model_type
    `ckpt_repair_remote_<arch>`, tools/vllm_remote_configs.py: its class comes with remote code) gets that plain
    config class registered with transformers' AutoConfig, as tools/vllm_arch_check.py's process has it."""
    from vllm_remote_configs import model_type, register

    for arch in config.get("architectures") or []:
        if isinstance(arch, str) and config.get("model_type") == model_type(arch):
            register(arch)


def write_eagle3_target(draft: dict, folder: str) -> None:
    """The target model an EAGLE-3 draft is loaded beside: a BF16 Llama of the draft's sizes, config.json only (the
    draft's own weights are the only ones read)."""
    import os

    keep = {k: v for k, v in draft.items() if k not in ("quantization_config", "eagle_config", "draft_vocab_size")}
    keep["architectures"] = ["LlamaForCausalLM"]
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(keep, f)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", metavar="DIR")
    p.add_argument("--hash", action="store_true", help="add sha256 of every loaded parameter")
    p.add_argument("--traceback", action="store_true", help="print the traceback of load errors to stderr")
    p.add_argument("--moe-emulation", action="store_true",
                   help="NVFP4 MoE layers fall back to vLLM's EMULATION backend when no backend supports CPU")
    p.add_argument("--global-scales", action="store_true",
                   help="report each NVFP4 linear's per-shard weight_scale_2 and the global scale vLLM keeps")
    args = p.parse_args(argv)
    try:
        enable_cpu_nvfp4()
        torchvision_stand_in()
        kernel_stand_ins()
        if args.moe_emulation:
            nvfp4_moe_emulation_fallback()
        scales = GlobalScales() if args.global_scales else None
        extra = (lambda model: dict(quant_methods(model), **scales.snapshot(model))) if scales else quant_methods
        loader = Loader(args.hash, extra=extra)
    except Exception:
        import traceback

        traceback.print_exc(file=sys.stderr)
        return 3
    for folder in args.dirs:
        t0, calls = time.perf_counter(), len(STAND_IN_CALLS)
        result = reported(folder, lambda: load(folder, loader), args.traceback, log)
        if scales is not None and result.get("ok"):
            result.update(scales.after())
        emit(dict({"dir": folder}, **result, stand_in_calls=STAND_IN_CALLS[calls:],
                  load_s=round(time.perf_counter() - t0, 2)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
