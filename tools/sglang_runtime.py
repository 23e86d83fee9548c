"""SGLang 0.5.23 set up as it sets itself up in a scheduler process, on CPU, without a GPU or a server.

Runs in .venv-sglang (tools/sglang_env.sh); imports nothing from the repo's `repair` package.

What is SGLang's own and what is a stand-in:
  * SGLang's: `ModelConfig(path)` (reads config.json, detects the quantization method), the loader's
    `_get_quantization_config` (the model class's packed_modules_mapping and remap_prefix, `get_quant_config`,
    `*Config.from_config`), the model class from its registry (`get_model_architecture`), the model built by
    its own `__init__` (every Linear / FusedMoE / ParallelLMHead asks `quant_config.get_quant_method(layer,
    prefix)`, i.e. `is_layer_skipped`, `is_layer_excluded`, `_resolve_quant_algo`, `should_ignore_layer` and
    the fused-shard checks) and its `load_weights`.
  * Stand-ins: GPU-only imports (tools/sglang_stubs.py); a gloo world of one process; the machine's facts
    say "Blackwell GPU" (SGLang's own `override_platform(is_blackwell=True)`, `torch.cuda.get_device_capability`
    -> (10, 0), server `device="cuda"`): NVFP4 methods refuse to be built on other platforms, and these facts
    choose kernels, not which method a layer gets. `SGLANG_USE_CPU_ENGINE` stays unset (it would pad
    instead of failing, research note §1.4). Layers are built on the meta device (no memory, no kernels).
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.pop("SGLANG_USE_CPU_ENGINE", None)

from tools import sglang_stubs  # noqa: E402

sglang_stubs.install()

import torch  # noqa: E402

DEVICE = "cuda"  # what a GPU server says: layers take the CUDA path (DeepSeek's CPU rope path asserts on the config)
BLACKWELL = (10, 0)  # what capability checks (compressed-tensors' scheme support) read instead of asking a GPU
_WORLD: list[bool] = []  # the gloo world is made once per process (SGLang's groups are process globals)

# quant-method class -> the scheme token doctor reports ("bf16": built unquantized)
SCHEMES = {"ModelOptFp4LinearMethod": "nvfp4", "ModelOptNvFp4A16LinearMethod": "w4a16_nvfp4",
           "ModelOptFp8LinearMethod": "fp8", "ModelOptFp8MoEMethod": "fp8", "UnquantizedLinearMethod": "bf16",
           "UnquantizedFusedMoEMethod": "bf16", "NoneType": "bf16", "CompressedTensorsW4A4Fp4": "nvfp4",
           "CompressedTensorsW4A16Fp4": "w4a16_nvfp4", "ModelOptNvFp4EmbeddingMethod": "nvfp4",
           "CompressedTensorsW4A4Nvfp4MoE": "nvfp4", "UnquantizedEmbeddingMethod": "bf16"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup(path: str):
    """Server args, runtime context, MoE config and (once) the distributed world for checkpoint `path`."""
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.layers.moe.utils import initialize_moe_config
    from sglang.srt.runtime_context import SpawnRanks, override_platform, publish
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    torch.cuda.get_device_capability = lambda device=None: BLACKWELL
    gpu_mamba_cache()
    args = ServerArgs(model_path=path, device=DEVICE)
    set_global_server_args_for_scheduler(args)
    publish(args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=0))
    if not _WORLD:
        override_platform(is_blackwell=True).install()
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel(backend="gloo")
        _WORLD.append(True)
    initialize_moe_config()
    return args


def gpu_mamba_cache() -> None:
    """The GPU server's platform fact for hybrid (Mamba / linear-attention) models: its Mamba cache keeps state
    snapshots (arg_groups/mamba_hook.py:102-112 answers False on CPU, and server-args resolution then asserts at
    :120, before any layer is built: Qwen4Exp, Qwen3-Next). It sizes a cache, not which method a layer gets."""
    from sglang.srt.arg_groups import mamba_hook

    mamba_hook._platform_supports_mamba_cache_extra_buffer = lambda: True


def tensor_parallel(size: int, rank: int) -> None:
    """Linear and vocab-parallel layers built from now on partition their weights as rank `rank` of `size`.

    SGLang resolves a layer's TP group in `linear._resolve_linear_group`; before communication exists it uses
    its own `_LogicalGroup(rank_in_group, world_size)`. The stand-in returns that for the TP groups, so
    the layers' sizes and their weight loaders' narrowing are rank `rank`'s (no collective runs while loading).
    Other parallel state (attention heads per rank, MoE) stays at one rank."""
    from sglang.srt.layers import linear, vocab_parallel_embedding

    original = getattr(linear, "_original_resolve_linear_group", linear._resolve_linear_group)
    linear._original_resolve_linear_group = original

    def resolve(parallel_group):
        if size > 1 and parallel_group in (None, "tp", "attn_tp"):
            return linear._LogicalGroup(rank, size)
        return original(parallel_group)

    linear._resolve_linear_group = resolve
    vocab_parallel_embedding._resolve_linear_group = resolve


def build(path: str, device: str = "meta"):
    """(model, quant_config): the model class SGLang picks for `path`, built by its own constructor."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.model_loader.loader import _get_quantization_config
    from sglang.srt.model_loader.utils import get_model_architecture, set_default_torch_dtype

    setup(path)
    model_config = ModelConfig(path)
    quant_config = _get_quantization_config(model_config, LoadConfig())
    cls, _ = get_model_architecture(model_config)
    if quant_config is not None:
        _record_asked(quant_config)
    with set_default_torch_dtype(model_config.dtype), torch.device(device):  # as its loader builds a model
        model = cls(config=model_config.hf_config, quant_config=quant_config, prefix="")
    return model, quant_config


def _record_asked(quant_config) -> None:
    """Each layer remembers the prefix its constructor handed `get_quant_method` (`_asked_prefix`): the name SGLang's
    exclusion rules are applied to, which may differ from the module's path (Gemma 4's vision `qkv.qkv_proj` is asked
    as `self_attn.qkv_proj`). The same method is still called with the same arguments."""
    original = quant_config.get_quant_method

    def asked(layer, prefix, *args, **kwargs):
        layer._asked_prefix = prefix
        return original(layer, prefix, *args, **kwargs)

    quant_config.get_quant_method = asked


def scheme_of(module) -> str:
    """The scheme token of the quant method SGLang gave `module` (the class name when it has no token)."""
    method = getattr(module, "quant_method", None)
    name = type(method).__name__
    if name.startswith("CompressedTensors") and getattr(module, "scheme", None) is not None:
        name = type(module.scheme).__name__
    if name == "ModelOptNvFp4FusedMoEMethod":
        return "w4a16_nvfp4" if method.quant_config.is_w4a16 else "nvfp4"
    return SCHEMES.get(name, name)


def layers(model, quant_config) -> dict[str, dict]:
    """Every layer with a weight: prefix -> {"class", "method", "scheme", "fused"}. Linear, FusedMoE, embedding and
    lm_head layers carry the quant method their get_quant_method chose; any other module owning a `weight`
    parameter (DeepSeek's MoEGate, norms of 2-D weights) is a plain parameter, BF16 as SGLang builds it.

    "fused" lists the checkpoint shard names SGLang loads into a fused layer (the quant config's
    packed_modules_mapping, else the fallback is_layer_skipped uses), so its decision maps back to checkpoint
    modules whose tensors its load_weights merges before loading (DeepSeek's q_a_proj + kv_a_proj_with_mqa).
    "asked" is the prefix the layer's constructor asked the quant config about (None: never asked)."""
    from sglang.srt.layers.quantization.utils import _FALLBACK_FUSED_SHARDS

    mapping = getattr(quant_config, "packed_modules_mapping", None) or getattr(model, "packed_modules_mapping", None) or {}
    out = {}
    for prefix, module in model.named_modules():
        if not hasattr(module, "quant_method") and "weight" not in dict(module.named_parameters(recurse=False)):
            continue
        leaf = prefix.rpartition(".")[2]
        shards = (mapping if leaf in mapping else _FALLBACK_FUSED_SHARDS).get(leaf)  # as is_layer_skipped picks
        shards = shards if isinstance(shards, (list, tuple)) else None
        out[prefix] = {"class": type(module).__name__, "method": type(getattr(module, "quant_method", None)).__name__,
                       "scheme": scheme_of(module), "fused": list(shards) if shards else None,
                       "asked": getattr(module, "_asked_prefix", None)}
    return out
