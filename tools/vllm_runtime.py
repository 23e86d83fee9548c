"""What every vLLM-venv script of tools/ needs: clean JSON stdout, NVFP4 linears on CPU, a world of one, snapshots.

Run inside the .venv-vllm python (tools/vllm_env.sh) and imported FIRST by tools/vllm_probe.py, tools/vllm_load.py
and tools/vllm_declared.py (they run as scripts, so tools/ is on sys.path): importing it keeps a private handle on the
real stdout for JSON lines (``emit``) and sends fd 1 (vLLM's logs and prints) to stderr. Imports nothing from
``repair``.

Shims, each only letting vLLM 0.32's own code run on a CPU host:
  * ``register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")``: stock 0.32 has CUDA/ROCm NVFP4
    linear kernels only, so without it an NVFP4 linear cannot even be constructed on CPU;
  * ``vllm.v1.worker.cpu_model_runner._set_torch_accelerator_to_noop()``: what vLLM's CPU runner itself does;
  * ``world_of_one``: gloo ``init_distributed_environment`` (world 1) + ``initialize_model_parallel(1, 1)``, with the
    TP group's size/rank optionally overridden so the layers allocate (and the weight loaders narrow to) rank R of N;
  * ``torchvision_stand_in`` + ``inspect_in_process``: model files whose text or vision towers never use torchvision
    import it through transformers' image processors (gemma4_mm.py, qwen3_5.py); see their docstrings for why the
    stand-in decides nothing;
  * ``flash_attention_stand_in``: an attention layer whose constructor refuses without FlashAttention (Qwen4Exp's QSA)
    is built and loaded, which runs no attention kernel; every FlashAttention entry point is a recorded placeholder;
  * ``kernel_stand_ins``: that one and tools/vllm_gpu_stand_ins.py's (sparse MLA layers, which the CPU platform
    refuses to construct; MLA layers of a release that builds them with the FlashAttention prefill backend on CPU;
    the CUDA events and streams Inkling's and DeepSeek-V4's layers make when built, which a CPU-only torch refuses),
    each deciding nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import sys

from sglang_stubs import CALLED as STAND_IN_CALLS  # noqa: F401  (re-exported: every call into a stand-in)
from sglang_stubs import install as install_stand_ins
from sglang_stubs import placeholder

JSON_OUT = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
sys.stdout.flush()
os.dup2(2, 1)
sys.stdout = sys.stderr
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def emit(obj: dict) -> None:
    """One JSON line on the real stdout."""
    JSON_OUT.write(json.dumps(obj, sort_keys=False) + "\n")
    JSON_OUT.flush()


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def enable_cpu_nvfp4() -> None:
    """NVFP4 linears constructible on CPU (vLLM's own emulation kernel) and the CPU runner's accelerator no-op."""
    from vllm.model_executor.kernels.linear import register_linear_kernel
    from vllm.model_executor.kernels.linear.nvfp4.emulation import EmulationNvFp4LinearKernel
    from vllm.platforms import PlatformEnum
    from vllm.v1.worker.cpu_model_runner import _set_torch_accelerator_to_noop

    register_linear_kernel(EmulationNvFp4LinearKernel, PlatformEnum.CPU, "nvfp4")
    _set_torch_accelerator_to_noop()


def torchvision_stand_in() -> bool:
    """A `torchvision` stand-in (tools/sglang_stubs.py: every attribute an inert placeholder that raises and is recorded
    in STAND_IN_CALLS when called) when transformers finds none installed; True if installed.

    Why it decides nothing: transformers' answer to "is torchvision available" is asked (and cached) before the stand-in
    exists, so it stays False and transformers keeps its torchvision-free code paths; the stand-in only satisfies the
    module-level ``from torchvision... import`` of image processors (transformers' gemma4/image_processing_gemma4.py),
    which nothing calls while a model is built and loaded; vLLM's model code itself imports no torchvision. A call into
    it fails the load and is listed (vllm_load.py reports them per folder)."""
    from transformers.utils.import_utils import is_torchvision_available

    if is_torchvision_available():
        return False
    install_stand_ins(("torchvision",))
    print("[vllm_runtime] shim: torchvision stand-in (none installed) for transformers' image processor imports",
          file=sys.stderr, flush=True)
    if is_torchvision_available():  # not cached after all: transformers would now take the stand-in for the real one
        raise RuntimeError("transformers sees the torchvision stand-in as installed")
    return True


# architecture -> the model module whose attention constructor asks FlashAttention's availability check, and refuses
# to build without it, though building and loading the layer run no attention kernel. vLLM 0.32:
# models/qwen4_exp/nvidia/qsa.py:252 (Qwen4ExpQSAFlashAttentionImpl.__init__; the kernels run only in forward_qsa).
FLASH_ATTENTION_ASKED = {"Qwen4ExpForCausalLM": "vllm.models.qwen4_exp.nvidia.qsa"}
# what FlashAttentionImpl (v1/attention/backends/flash_attn.py) imports from fa_utils only where FlashAttention exists
FLASH_ATTENTION_ENTRY_POINTS = ("flash_attn_varlen_func", "get_scheduler_metadata", "reshape_and_cache_flash",
                                "compile_flash_attn_varlen_func_from_specs", "flash_attn_supports_sinks")


def flash_attention_stand_in() -> list[str]:
    """On a host without FlashAttention, the modules of FLASH_ATTENTION_ASKED (in this vLLM's registry) are told it
    exists; the modules told so are returned.

    Why it decides nothing: only those modules' own name for the check answers yes (every other backend still sees
    none), and every entry point the answer vouches for, absent from flash_attn.py here, becomes a placeholder that
    raises and is recorded in STAND_IN_CALLS when called (tools/sglang_stubs.py): a build or load that reached a
    FlashAttention kernel fails and is listed, never runs on a stand-in's result."""
    from vllm import ModelRegistry
    from vllm.v1.attention.backends import fa_utils, flash_attn

    if fa_utils.is_flash_attn_varlen_func_available():
        return []
    for name in FLASH_ATTENTION_ENTRY_POINTS:
        if not hasattr(flash_attn, name):
            setattr(flash_attn, name, placeholder(f"{flash_attn.__name__}.{name}"))
    told = []
    for arch, module_name in FLASH_ATTENTION_ASKED.items():
        if arch in ModelRegistry.get_supported_archs() and ModelRegistry._try_load_model_cls(arch) is not None:
            module = sys.modules.get(module_name)
            if module is not None and hasattr(module, "is_flash_attn_varlen_func_available"):
                module.is_flash_attn_varlen_func_available = lambda: True
                told.append(module_name)
    if told:
        print(f"[vllm_runtime] shim: FlashAttention stand-in (every entry point recorded) for {', '.join(told)}",
              file=sys.stderr, flush=True)
    return told


def kernel_stand_ins() -> None:
    """Every attention stand-in: layers whose constructor refuses on CPU are built and loaded, no kernel runs on one."""
    from vllm_gpu_stand_ins import cuda_sync_stand_in, mla_prefill_stand_in, sparse_mla_stand_in

    flash_attention_stand_in()
    sparse_mla_stand_in()
    mla_prefill_stand_in()
    cuda_sync_stand_in()


def inspect_in_process(architectures) -> None:
    """Register each named architecture's class, imported here, in vLLM's registry.

    vLLM inspects a lazily registered class in a subprocess (registry.py _LazyRegisteredModel.inspect_model_cls), which
    sees none of the shims; registered as a class, the same ``_ModelInfo.from_model_cls`` runs on the same class in
    this process. A name the registry lacks, or a class that fails to import (a GPU-only import, a platform that
    refuses it), is left as it was: vLLM's own build then fails with the reason."""
    import torch
    from vllm import ModelRegistry

    for arch in architectures if isinstance(architectures, list) else []:
        if isinstance(arch, str) and arch in ModelRegistry.get_supported_archs():
            try:
                model_cls = ModelRegistry._try_load_model_cls(arch)
            except ValueError:  # current_platform.verify_model_arch
                continue
            if isinstance(model_cls, type) and issubclass(model_cls, torch.nn.Module):  # else register_model refuses
                ModelRegistry.register_model(arch, model_cls)


@contextlib.contextmanager
def world_of_one(vc, tp_size: int = 1, tp_rank: int = 0):
    """vLLM's distributed state for one process (new port each time), torn down on exit; TP size/rank simulated."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state as ps

    with set_current_vllm_config(vc):
        ps.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                        distributed_init_method=f"tcp://127.0.0.1:{free_port()}", backend="gloo")
        ps.initialize_model_parallel(1, 1)
        if tp_size != 1:
            tp = ps.get_tp_group()
            tp.world_size = tp_size
            tp.rank_in_group = tp_rank
        try:
            yield
        finally:
            ps.destroy_model_parallel()
            ps.destroy_distributed_environment()


def nvfp4_moe_emulation_fallback() -> None:
    """NVFP4 MoE methods pick a kernel backend in __init__, after the quant config chose them; no backend
    supports CPU, so vLLM's own selection raising NotImplementedError falls back to its EMULATION backend.
    Only the kernel choice changes: which method a layer gets is decided before this runs."""
    import importlib

    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle

    def select(*args, **kwargs):
        try:
            return oracle.select_nvfp4_moe_backend(*args, **kwargs)
        except NotImplementedError:
            backend = oracle.NvFp4MoeBackend.EMULATION
            return backend, oracle.backend_to_kernel_cls(backend)[0]

    for name in ("vllm.model_executor.layers.quantization.modelopt",
                 "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe"
                 ".compressed_tensors_moe_w4a4_nvfp4"):
        importlib.import_module(name).select_nvfp4_moe_backend = select


def tensor_entry(t, with_hash: bool) -> dict:
    """dtype, shape and (with_hash) sha256 of the tensor's raw bytes as it sits in memory (row-major, little-endian)."""
    import torch

    t = t.detach()
    entry = {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape)}
    if with_hash:
        flat = t.contiguous().reshape(-1).cpu()
        entry["sha256"] = hashlib.sha256(flat.view(torch.uint8).numpy().tobytes()).hexdigest()
    return entry


def describe(model, with_hash: bool) -> dict:
    """{"params": named_parameters(), "buffers": persistent buffers}, each name -> tensor_entry."""
    params = {name: tensor_entry(p, with_hash) for name, p in model.named_parameters()}
    buffers = {}
    for mod_name, mod in model.named_modules():
        for bname, b in mod.named_buffers(recurse=False):
            if b is None or bname in getattr(mod, "_non_persistent_buffers_set", ()):
                continue
            buffers[f"{mod_name}.{bname}" if mod_name else bname] = tensor_entry(b, with_hash)
    return {"params": params, "buffers": buffers}


def tracked(load_config):
    """The load config with ``enable_weights_track=True``: vLLM then names every parameter the checkpoint did not
    fill (its default checks that only for unquantized models)."""
    import dataclasses

    extra = dict(load_config.model_loader_extra_config or {}, enable_weights_track=True)
    return dataclasses.replace(load_config, model_loader_extra_config=extra)


def reported(label: str, attempt, show_traceback: bool, log) -> dict:
    """attempt() (a dict), or {"ok": false, "error_type", "error": str(exception) verbatim} when it raises."""
    import traceback

    try:
        return attempt()
    except Exception as e:  # the checkpoint's fault (or vLLM's): report it
        if show_traceback:
            traceback.print_exc(file=sys.stderr)
        else:
            log(f"{label}: {type(e).__name__}: {str(e)[:500]}")
        return {"ok": False, "error_type": type(e).__name__, "error": str(e)}


class Loader:
    """vLLM's get_model in a world of one, described as the weight loaders left it.

    Wraps base_loader.process_weights_after_loading so the description (``describe`` plus ``extra(model)``) is taken
    right before vLLM repacks the weights for its kernels; if that step never runs, the model get_model returned is
    described. A failure inside process_weights_after_loading still raises."""

    def __init__(self, with_hash: bool, extra=None):
        from vllm.model_executor.model_loader import base_loader

        self.with_hash = with_hash
        self.extra = extra or (lambda model: {})
        self._snapshot: dict | None = None
        original = base_loader.process_weights_after_loading

        def wrapper(model, model_config, target_device):
            self._snapshot = self._describe(model)
            return original(model, model_config, target_device)

        base_loader.process_weights_after_loading = wrapper

    def _describe(self, model) -> dict:
        return dict(describe(model, self.with_hash), **self.extra(model))

    def load(self, vc, model_config, load_config, tp_size: int = 1, tp_rank: int = 0) -> dict:
        import gc

        from vllm.model_executor.model_loader import get_model

        self._snapshot = model = None
        try:
            with world_of_one(vc, tp_size, tp_rank):
                model = get_model(vllm_config=vc, model_config=model_config, load_config=load_config)
            return dict({"ok": True}, **(self._snapshot or self._describe(model)))
        finally:
            del model
            self._snapshot = None
            gc.collect()
