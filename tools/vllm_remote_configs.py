"""Small configs for vLLM architectures whose config class comes with remote code only (run in .venv-vllm).

Neither transformers nor vLLM ships a config class for these (InternLM2, Orion, TeleChat2, ...): the published
checkpoints carry `configuration_*.py` for --trust-remote-code. vLLM's own model code is the reader that matters, so
the config is learned from it: a plain PretrainedConfig subclass is registered with transformers' AutoConfig under
a model_type of our own (it holds exactly the config.json fields, nothing else), the class is built on the meta
device as the profile builds every class, and each attribute vLLM's code reads and the config lacks (an
AttributeError naming it) is answered from GENERIC, then the build is tried again. The attributes answered are the
fields the class was seen to read; the profile row's `config.source` lists them. A read GENERIC does not answer, or
any other failure to build, leaves the architecture unprofiled with that reason (never a row from a guessed layout).
Reads with a default (`getattr(config, "x", default)`) take vLLM's default: the path of a config without the field.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import re

from vllm_profile_configs import SMALL, NoConfig

# field -> the value answered when vLLM's model code reads it: SMALL's sizes, and for every other field the value
# that takes the plain path (no bias, no dropout, no MuP scaling, default RoPE, every layer full attention, softmax
# routing): no value here chooses a layer kind a published config of the family would not have
GENERIC: dict = {
    **SMALL, "rms_norm_eps": 1e-6, "layer_norm_epsilon": 1e-6, "layernorm_epsilon": 1e-6, "norm_epsilon": 1e-6,
    "rope_theta": 10000.0, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "partial_rotary_factor": 1.0, "rotary_dim": 16, "hidden_act": "silu", "tie_word_embeddings": False,
    "attention_bias": False, "bias": False, "use_bias": False, "use_qkv_bias": False, "qkv_bias": False,
    "mlp_bias": False, "use_qk_norm": False, "embedding_dropout": 0.0, "attention_dropout": 0.0,
    "hidden_dropout": 0.0, "use_mup": False, "query_pre_attn_scalar": 16,
    "layer_types": ["full_attention", "full_attention"], "num_shared_experts": 1, "norm_topk_prob": True,
    "scoring_func": "softmax", "score_function": "softmax", "topk_method": "greedy", "routed_scaling_factor": 1.0,
    "moe_layer_freq": 1, "num_experts_per_token": 2, "moe_router_enable_expert_bias": False,
    "initializer_range": 0.02, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
    "activation_function": "silu", "dim_model_base": 64, "scale_emb": 1.0, "scale_depth": 1.0,  # MuP: no sizes
}
_MISSING = re.compile(r"object has no attribute '(\w+)'")
LEARNED = "learned from vLLM's model code"  # a row's config.source starts so (tools/profile_report.py reads it)
NO_ANSWER = "vLLM's model reads a config field no generic value answers"
UNBUILT = "vLLM cannot build it from a config of generic values"


def model_type(arch: str) -> str:
    """The model_type the learned config is registered under: ours, so no transformers or vLLM class answers it."""
    return f"ckpt_repair_remote_{arch.lower()}"


def register(arch: str) -> str:
    """Register (once) a plain PretrainedConfig subclass for `arch` with transformers' AutoConfig; its model_type."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    name = model_type(arch)
    if name not in CONFIG_MAPPING:
        AutoConfig.register(name, type(f"Remote{arch}Config", (PretrainedConfig,), {"model_type": name}))
    return name


def remote_config(arch: str, failure) -> tuple[dict, str]:
    """(config dict without architectures, its provenance) that vLLM's model class for `arch` builds from, or NoConfig.
    `failure(config)` builds the class from a config dict and returns the exception it raised, None when it built."""
    config: dict = {"model_type": register(arch)}
    reads: list[str] = []
    while True:
        error = failure(config)
        if error is None:
            return config, (f"{LEARNED} (tools/vllm_remote_configs.py GENERIC): it read "
                            + ", ".join(reads))
        field = _MISSING.search(str(error)) if isinstance(error, AttributeError) else None
        if field is None or field.group(1) in config:
            raise NoConfig(f"{UNBUILT}: {type(error).__name__}: {str(error)[:160]}")
        if field.group(1) not in GENERIC:
            raise NoConfig(f"{NO_ANSWER}: {field.group(1)}")
        config[field.group(1)] = GENERIC[field.group(1)]
        reads.append(field.group(1))
