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
  * ``cuda_classes`` is no stand-in but the choice a GPU host makes: where a model package picks its classes per
    platform and this host imported another class than a CUDA host does, the CUDA one is built instead
    (``cuda_exports``: the package's own __init__ run again with current_platform answering as CUDA does). In 0.32
    that is DeepSeek-V4 (its `cpu` classes here, models/deepseek_v4/__init__.py:33-38; nvidia/model.py, nvidia/mtp.py
    on CUDA) and DeepSeek-V3.2 / GLM-5 (models/deepseek_v32/__init__.py:17-33: nvidia/model.py, nvidia/mtp.py only
    where is_cuda(), deepseek_v2's generic DeepseekV3ForCausalLM / GlmMoeDsaForCausalLM and deepseek_mtp's DeepSeekMTP
    on CPU and XPU); hy_v4, inkling, kimi_k3, minimax_m3, qwen4_exp, deepseek_v41 and glm5next import the CUDA classes
    here too (tests/vllm/test_platform_packages_vs_cuda.py). DeepSeek-V3.2's NVIDIA class builds on the stand-ins
    below with nothing more: the one GPU fact it asks when built is SM103 (nvidia/glm52_low_latency_gemm.py:88, :180),
    and there it only gives an unquantized BF16 linear a subclass of UnquantizedLinearMethod (:186-197), so no state
    changes; its layers and names are deepseek_v2's (the same fused q_a/kv_a and indexer wk/weights_proj,
    nvidia/model.py:329-336; the same per-layer indexer rule, attention.py:166-200 and deepseek_v2.py:1142-1189), and
    its rows are byte-identical to the generic class's (measured). For DeepSeek-V4 nothing else a GPU decides changes a layer: the
    attention class (nvidia/model.py:1013-1044: FlashMLA, or FlashInfer on SM12 / when asked) only adds buffers to
    DeepseekV4Attention, whose linears are the same (attention.py:248-283); MegaMoE experts are built only when the
    user asks `--kernel-config moe_backend` with expert parallel (nvidia/model.py:683-692), otherwise FusedMoE.
    Its build asks one GPU fact: ``fp8_einsum_recipe_stand_in``. Where the package's choice cannot be read, or a
    `cpu` class stays, ``cpu_implementation`` says why the profile takes no row from it.
  * ``fp8_einsum_recipe_stand_in``: DeepSeek-V4's CUDA attention classes ask the device capability when built
    (nvidia/ops/o_proj.py:29 asserts one) for a recipe read only in forward: two recorded values every use of which
    raises.
"""

from __future__ import annotations

import ast
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



RAISED_FOR_THE_CALLER = ("__getattr__",)  # their AttributeError is the caller's lookup failing (tools/raised_by.py)
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
PLATFORM_TESTS_TRUE_ON_CUDA = ("is_cuda", "is_cuda_alike")  # vllm/platforms/interface.py: what a CUDA platform answers


def cpu_implementation(model_class: type) -> str | None:
    """Why the profile takes no row from `model_class`, where it is still vLLM's own CPU implementation of the
    architecture (a module under a `cpu` package of vllm.models: `cuda_classes` found no CUDA class for it), else None."""
    module = getattr(model_class, "__module__", "") or ""
    if not module.startswith("vllm.models.") or ".cpu." not in f"{module}.":
        return None
    return f"{CPU_IMPLEMENTATION} ({module}), not the class a GPU builds (its model package picks one per platform)"


class _CudaAnswers:
    """What a package's __init__ may ask vLLM's platform, answered as a CUDA platform does: is_cuda / is_cuda_alike
    true, every other is_X() (no arguments) false, device_type "cuda". Anything else it asks raises ValueError: then
    nothing here can say what a GPU builds."""

    device_type = "cuda"

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if not name.startswith("is_"):
            raise ValueError(f"a model package's __init__ asks current_platform.{name}: no CUDA answer is known here")

        def answer(*args, **kwargs) -> bool:
            if args or kwargs:
                raise ValueError(f"a model package's __init__ asks current_platform.{name}{args}: no CUDA answer here")
            return name in PLATFORM_TESTS_TRUE_ON_CUDA

        return answer


class _OwnPlatform(ast.NodeTransformer):
    """Drops every `from vllm.platforms import current_platform` (top level and in functions such as a module
    `__getattr__`), so the name is the module's global: the CUDA answers."""

    def visit_ImportFrom(self, node: ast.ImportFrom):
        if node.module != "vllm.platforms":
            return node
        node.names = [a for a in node.names if (a.asname or a.name) != "current_platform"]
        return node if node.names else ast.Pass()


def asks_platform(path: str) -> bool:
    """The package __init__ at `path` asks vLLM's platform (picks what it exports per platform)."""
    with open(path, encoding="utf-8") as f:
        return "current_platform" in f.read()


def cuda_exports(package: str) -> dict[str, object]:
    """What vLLM's model package `package` exports (`__all__`) on a CUDA platform: its own __init__ run again, apart
    from the module this host imported, with current_platform answering as CUDA does (`_CudaAnswers`), including its
    module `__getattr__` where it resolves names lazily (0.32's inkling, qwen4_exp). Every branch forms a package
    uses (`if TYPE_CHECKING or not is_rocm()`, `elif device_type == "tpu"`, `if is_cuda(): .. elif is_rocm(): ..
    else:`) is its own code deciding, not a reading of it. {} where the package does not ask the platform."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.origin or not spec.origin.endswith("__init__.py") or not asks_platform(spec.origin):
        return {}
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.fix_missing_locations(_OwnPlatform().visit(ast.parse(f.read())))
    namespace = {"__name__": package, "__package__": package, "__file__": spec.origin,
                 "__path__": list(spec.submodule_search_locations or ()), "current_platform": _CudaAnswers()}
    exec(compile(tree, spec.origin, "exec"), namespace)  # vLLM's own __init__, as on a CUDA host
    lazy = namespace.get("__getattr__")
    return {name: namespace[name] if name in namespace else lazy(name)
            for name in namespace.get("__all__", ()) if name in namespace or lazy is not None}


def cuda_implementation(package: str, name: str, here: type) -> type | None:
    """The class `name` that vLLM's model package `package` (the registry's module for an architecture) exports on a
    CUDA platform (`cuda_exports`), where it is another class than `here` (the one this host imported); None where the
    package picks nothing per platform or picks `here`. vLLM 0.32's models/deepseek_v4/__init__.py:16-48 imports
    cpu/model.py on a CPU platform and nvidia/model.py otherwise: the CPU class maps `.input_scale` to
    `.input_scale_2` and a linear's `.weight_scale` to `.weight_scale_inv` (cpu/model.py:810, :841; NVIDIA's mapper
    does neither, nvidia/model.py:1712-1755) and packs no `fused_wkv_wgate` (cpu/model.py:853-856;
    nvidia/model.py:1809-1813), so a row from it would be the CPU's. models/deepseek_v32/__init__.py:17-33 imports
    nvidia/model.py only where is_cuda(), deepseek_v2's generic classes on CPU and XPU."""
    found = cuda_exports(package).get(name)
    return None if found is None or found is here else found


def cuda_classes(arch: str) -> dict[str, type]:
    """`arch` and its MTP drafters (the names vLLM's registry resolves through the same model package: DeepSeek-V4's
    `DeepSeekV4MTPModel`) -> the class that package exports on a CUDA platform (`cuda_implementation`), where this host
    imported another; each registered in vLLM's registry in its place, with the stand-in its build needs here
    (`fp8_einsum_recipe_stand_in`). {} where the package picks nothing per platform: the registry is left as it is."""
    from vllm import ModelRegistry

    package = getattr(ModelRegistry.models.get(arch), "module_name", None)
    if package is None:
        return {}
    names = [arch] + [n for n, e in ModelRegistry.models.items()
                      if ("MTP" in n or "NextN" in n) and getattr(e, "module_name", None) == package]
    out = {}
    for name in names:  # every class the package exports otherwise on CUDA: a `cpu` one (deepseek_v4) or deepseek_v2's
        here = ModelRegistry._try_load_model_cls(name)  # generic one (deepseek_v32)
        if here is None:
            continue
        found = cuda_implementation(package, ModelRegistry.models[name].class_name, here)
        if found is not None:
            out[name] = found
    if out:
        fp8_einsum_recipe_stand_in()
        for name, cls in out.items():
            ModelRegistry.register_model(name, cls)
    return out


EINSUM_RECIPE_USERS = ("vllm.models.deepseek_v4.nvidia.flashmla", "vllm.models.deepseek_v4.nvidia.flashinfer_sparse")
RECORDED_USES = ("__getitem__", "__iter__", "__len__", "__bool__", "__index__", "__int__")


def _recorded_value(qualname: str) -> object:
    """A value that can be made and kept, every use of which (index, iterate, truth, number) is a recorded placeholder
    that raises."""
    def use(dunder: str):
        return lambda self, *args, **kwargs: placeholder(f"{qualname}.{dunder}")()

    return type(qualname.rpartition(".")[2], (), {"__qualname__": qualname, **{d: use(d) for d in RECORDED_USES}})()


def fp8_einsum_recipe_stand_in() -> bool:
    """True when installed: this host has no CUDA device capability, which DeepSeek-V4's CUDA attention classes ask
    when built (nvidia/flashmla.py:59, nvidia/flashinfer_sparse.py:239, :671 call compute_fp8_einsum_recipe,
    nvidia/ops/o_proj.py:19-32: `assert cap is not None, "DeepseekV4 attention requires a CUDA device"`). Its two
    results (the FP8 einsum recipe and whether scales are TMA-aligned, chosen by SM90 / SM100) are only kept and read
    in forward (flashmla.py:61-74 `_o_proj`; flashinfer_sparse.py the same): they decide no layer, quant method, shape
    or name. Here each becomes a recorded value every use of which raises. A host with a capability is left as is."""
    import importlib

    from vllm.platforms import current_platform

    if current_platform.get_device_capability() is not None:
        return False
    users = []
    for name in EINSUM_RECIPE_USERS:
        try:
            users.append(importlib.import_module(name))
        except ImportError:  # a release without DeepSeek-V4's CUDA attention: nothing to stand in for
            return False
    qualname = "vllm.models.deepseek_v4.nvidia.ops.o_proj.compute_fp8_einsum_recipe"
    for module in users:
        module.compute_fp8_einsum_recipe = lambda *args, **kwargs: (_recorded_value(f"{qualname}.einsum_recipe"),
                                                                     _recorded_value(f"{qualname}.tma_aligned_scales"))
    print("[vllm_runtime] shim: FP8 einsum recipe stand-in (DeepSeek-V4 CUDA attention: every use recorded)",
          file=sys.stderr, flush=True)
    return True


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
