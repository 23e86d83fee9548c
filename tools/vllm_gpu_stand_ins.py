"""Stand-ins that let vLLM build (and load the weights of) GPU-only model code on a CPU host; each decides nothing.

Building a layer and loading its weights run no attention kernel, but vLLM 0.32 refuses to construct a sparse-MLA
layer on CPU before any weight exists: platforms/cpu.py:150 (`get_attn_backend_cls`) raises "Sparse Attention is not
supported on CPU." for every layer asking `use_sparse` (DeepSeek-V3.2 and GLM-5's DSA: models/deepseek_v2.py:1215
builds MLAAttention with `is_sparse`; layers/attention/mla_attention.py:513 asks the platform). Shims, imported by
tools/vllm_runtime.py's ``kernel_stand_ins`` (imports nothing from ``repair``):
  * ``sparse_mla_stand_in``: where the CPU platform refuses a sparse layer, the platform's answer becomes vLLM's own
    FlashMLA sparse backend (v1/attention/backends/mla/flashmla_sparse.py, the sparse backend of CUDA's priority lists,
    platforms/cuda.py:96-152), whose FlashMLA kernels (v1/attention/ops/flashmla.py: `_raise_flashmla_unavailable`
    here) become placeholders that raise and are recorded (tools/sglang_stubs.py). Every other layer's answer is the
    platform's own.
  * the workspace manager vLLM's GPU worker initialises before it builds a model (v1/worker/gpu_worker.py:551): the
    sparse impl reserves its scratch at construction (flashmla_sparse.py:838); here it is initialised on the meta
    device (so the reservation allocates nothing) when the first sparse layer is answered: vLLM's CPU worker makes
    none, and until then every other model sees that.
  * ``mla_prefill_stand_in``: a release whose CPU platform names no MLA prefill backend of its own (vLLM 0.28; 0.32's
    platforms/cpu.py:182 `get_mla_prefill_backend_cls` does) builds every MLA layer (DeepSeek-V2/V3/V3.2, GLM-4.7-Flash,
    GLM-5, LongCat, A.X K1) with the FlashAttention prefill backend: with no device capability its selector takes it
    (0.28 v1/attention/backends/mla/prefill/selector.py:110-115), constructed in MLAAttention.__init__
    (layers/attention/mla_attention.py:560-583). Two CUDA-only names stand in for that, as vLLM's own non-CUDA
    branches do: fa_utils.py defines `compile_flash_attn_varlen_func_from_specs` only on CUDA (its XPU and ROCm
    branches set it to None, fa_utils.py:32/:41; the CPU branch not at all) and prefill/flash_attn.py:18 imports it at
    module level: it becomes None, as there; it is asserted non-None only where an FA4 kernel is compiled at run time
    (prefill/flash_attn.py:259). The backend's constructor asserts its `flash_attn_varlen_func` (prefill/flash_attn.py
    :354; None where fa_utils has none, :36-39) and only keeps it for the prefill forward (:359-366, :429): it becomes a
    placeholder that raises and is recorded. Neither decides a layer, a quant method or a weight name: the prefill
    backend is asked only in forward (mla_attention.py:811, :832).
  * ``cuda_sync_stand_in``: on a torch built without CUDA, torch.cuda.Event and Stream are dummy classes that refuse
    to be made ("Tried to instantiate dummy base class Event"), and 0.32's Inkling MoE layer makes two events when it
    is built (models/inkling/nvidia/moe.py:479), DeepSeek-V4's attention four (models/deepseek_v4/attention.py:330)
    and its indexer two (:1049-1051). Both become classes whose instances can be made and kept, every method of which
    is a placeholder that raises and is recorded: the events are only recorded and waited on in forward, to overlap
    work on an auxiliary stream (inkling/nvidia/moe.py:522-524, the `_sink_stream` it pairs them with is None off CUDA,
    utils/torch_utils.py:875; attention.py:618-630, :724-725), so they decide no layer, quant method, shape or name.
    vLLM's own CPU worker makes the same substitution before it builds any model (v1/worker/cpu/shm.py:61-66, imported
    first by v1/worker/cpu_worker.py:5), with no-ops where these raise.
  * ``cpu_implementation`` is no stand-in: where a model package picks a CPU implementation of its own on this host
    (DeepSeek-V4), no stand-in makes it the class a GPU builds, and the profile records why it takes no row from it.
"""

from __future__ import annotations

import sys

from sglang_stubs import placeholder

SPARSE_MLA_BACKEND = "FLASHMLA_SPARSE"  # AttentionBackendEnum member (v1/attention/backends/registry.py)
# what flashmla_sparse.py imports from v1/attention/ops/flashmla.py: FlashMLA's CUDA kernels
FLASHMLA_ENTRY_POINTS = ("flash_mla_sparse_fwd", "flash_mla_with_kvcache", "get_mla_metadata")


def sparse_mla_stand_in() -> bool:
    """True when installed: the CPU platform refuses sparse MLA here (a release without sparse MLA, or a platform
    that has one, is left as it is)."""
    import torch

    from vllm.platforms import current_platform

    try:
        from vllm.v1.attention.backends.mla import flashmla_sparse
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
        from vllm.v1.worker.workspace import init_workspace_manager, is_workspace_manager_initialized
    except ImportError:  # an older release: no sparse MLA backend to stand in for
        return False
    if not current_platform.is_cpu() or not hasattr(AttentionBackendEnum, SPARSE_MLA_BACKEND):
        return False
    try:
        getattr(AttentionBackendEnum, SPARSE_MLA_BACKEND).get_class()
    except ImportError:  # the backend's own module does not import here: the platform's refusal stands
        return False
    for name in FLASHMLA_ENTRY_POINTS:
        setattr(flashmla_sparse, name, placeholder(f"{flashmla_sparse.__name__}.{name}"))
    platform = type(current_platform)
    refusing = platform.get_attn_backend_cls

    def get_attn_backend_cls(cls, selected_backend, attn_selector_config, num_heads=None):
        try:
            return refusing(selected_backend, attn_selector_config, num_heads)
        except NotImplementedError:
            if not attn_selector_config.use_sparse:
                raise
            if not is_workspace_manager_initialized():  # only once a sparse layer is built: others see vLLM's CPU state
                init_workspace_manager(torch.device("meta"))
            return getattr(AttentionBackendEnum, SPARSE_MLA_BACKEND).get_path()

    platform.get_attn_backend_cls = classmethod(get_attn_backend_cls)
    print(f"[vllm_runtime] shim: sparse MLA stand-in ({SPARSE_MLA_BACKEND}, every FlashMLA entry point recorded)",
          file=sys.stderr, flush=True)
    return True



CUDA_SYNC_CLASSES = ("Event", "Stream")  # torch.cuda's: what DeepSeek-V4's and Inkling's layers construct when built


def _sync_stand_in(qualname: str) -> type:
    """A class whose instances can be made and kept but every method of which is a recorded placeholder that raises."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return placeholder(f"{qualname}.{name}")

    return type(qualname.rpartition(".")[2], (), {"__init__": lambda self, *args, **kwargs: None,
                                                   "__getattr__": __getattr__, "__qualname__": qualname})


def cuda_sync_stand_in() -> bool:
    """True when installed: this torch has no CUDA, so torch.cuda.Event() / Stream() refuse to be made ("Tried to
    instantiate dummy base class Event"); a torch whose Event can be made is left as it is (module docstring)."""
    import torch

    try:
        torch.cuda.Event()
        return False
    except RuntimeError:
        pass
    for name in CUDA_SYNC_CLASSES:
        setattr(torch.cuda, name, _sync_stand_in(f"torch.cuda.{name}"))
    print("[vllm_runtime] shim: CUDA event/stream stand-in (torch.cuda.Event, torch.cuda.Stream: every method recorded)",
          file=sys.stderr, flush=True)
    return True


CPU_IMPLEMENTATION = "vLLM builds its CPU implementation of it on this host"  # tools/profile_report.py reads it


def cpu_implementation(model_class: type) -> str | None:
    """Why the profile takes no row from `model_class`, where it is vLLM's own CPU implementation of the architecture
    (a module under a `cpu` package of vllm.models), else None. No stand-in helps there: the model package picks its
    implementation per platform (0.32's models/deepseek_v4/__init__.py:33-38 imports cpu/model.py on a CPU platform,
    nvidia/model.py on CUDA), and the two are different code: DeepSeek-V4's CPU class maps `.input_scale` to
    `.input_scale_2` and a linear's `.weight_scale` to `.weight_scale_inv` (cpu/model.py:810, :841; NVIDIA's
    mapper does neither, nvidia/model.py:1712-1745) and packs no `fused_wkv_wgate` (cpu/model.py:853-856; nvidia/model.py:
    1809-1813), so its row would be the CPU's. (Measured, not shipped: the NVIDIA class builds here with the event
    stand-in and one more, for compute_fp8_einsum_recipe, which asserts a CUDA capability at build, nvidia/ops/o_proj.py
    :29, and whose result only _o_proj reads in forward, flashmla.py:59-74; but transformers' save_pretrained writes
    `model.`-prefixed names and `lm_head.weight`, which vLLM's mapper turns into `lm_lm_head`, while the published
    layout is `layers.N.*`, `embed.weight`, `head.weight`: the row's checkpoint names would need another source.)"""
    module = getattr(model_class, "__module__", "") or ""
    if not module.startswith("vllm.models.") or ".cpu." not in f"{module}.":
        return None
    return f"{CPU_IMPLEMENTATION} ({module}), not the class a GPU builds (its model package picks one per platform)"


def mla_prefill_stand_in() -> bool:
    """True when installed: the CPU platform has no MLA prefill backend of its own, so vLLM's selector takes the
    FlashAttention one (module docstring); a release whose platform answers itself (0.32) is left as it is."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu() or hasattr(type(current_platform), "get_mla_prefill_backend_cls"):
        return False
    from vllm.v1.attention.backends import fa_utils

    if not hasattr(fa_utils, "compile_flash_attn_varlen_func_from_specs"):
        fa_utils.compile_flash_attn_varlen_func_from_specs = None  # as fa_utils.py's XPU and ROCm branches
    try:
        from vllm.v1.attention.backends.mla.prefill import flash_attn as prefill
    except ImportError:  # a release without this backend: nothing to stand in for
        return False
    if prefill.flash_attn_varlen_func is None:
        prefill.flash_attn_varlen_func = placeholder(f"{prefill.__name__}.flash_attn_varlen_func")
    print("[vllm_runtime] shim: MLA prefill stand-in (FlashAttention prefill backend, its kernel recorded)",
          file=sys.stderr, flush=True)
    return True


REFERENCE_MLA_BACKEND = "CPU_MLA"  # AttentionBackendEnum member: vLLM's reference CPU MLA backend
AMX_MLA_BACKEND = "AMX_MLA"


def reference_mla_backend() -> dict:
    """EngineArgs asking for vLLM's reference CPU MLA backend where this release's CPU platform would take its AMX one.

    On a CPU with AMX tiles vLLM 0.32 builds every MLA layer with AMX_MLA unless CPU_MLA is asked for
    (platforms/cpu.py:152-164; check_and_update_config reads the same choice, :251-256). AMX_MLA repacks kv_b_proj
    for its tiles after the weights are loaded and refuses heads narrower than a tile: "invalid weight input features
    16" (v1/attention/backends/mla/amx_mla.py:303, torch.ops._C.convert_weight_packed) on the tier's small configs.
    That is this host's kernel, which no GPU runs; CPU_MLA is what every host without AMX gets, and the choice is made
    after every weight is loaded, so it decides nothing the tier judges. {} where the release has no such choice."""
    import torch

    try:
        from vllm.v1.attention.backends.registry import AttentionBackendEnum
    except ImportError:
        return {}
    known = hasattr(AttentionBackendEnum, REFERENCE_MLA_BACKEND) and hasattr(AttentionBackendEnum, AMX_MLA_BACKEND)
    amx = getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()
    return {"attention_backend": REFERENCE_MLA_BACKEND} if known and amx else {}
