"""Small configs for vLLM's registered architectures, from transformers' own config classes (run in .venv-vllm).

`small_config(arch)` returns (config dict, provenance, the defaults that chose a learned config's layers) or raises `NoConfig` with the reason. The config class is
the one transformers registers for the architecture's model_type (its auto-model mappings name the class); its
defaults are shrunk by overriding only the size keys the class has (hidden sizes, layer and head counts, experts),
passed to the class's own __init__ so derived fields (layer_types, head_dim) are recomputed by transformers.
Imports nothing from the repo's ``repair`` package.
"""

from __future__ import annotations

from vllm_mistral_config import mistral_format
from raised_by import reraise_ours
from vllm_small_extras import EXTRA

SMALL = {  # size key -> value (only keys the class's defaults hold are set)
    "hidden_size": 64, "intermediate_size": 128, "ffn_hidden_size": 128, "num_hidden_layers": 2, "num_layers": 2,
    "n_layer": 2, "n_layers": 2, "num_attention_heads": 4, "n_head": 4, "n_heads": 4, "num_key_value_heads": 2,
    "num_kv_heads": 2, "multi_query_group_num": 2, "head_dim": 16, "kv_channels": 16, "vocab_size": 256,
    "padded_vocab_size": 256, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 32,
    "num_experts": 4, "n_routed_experts": 4, "num_local_experts": 4, "moe_num_experts": 4, "num_experts_per_tok": 2,
    "moe_topk": 2, "moe_k": 2, "n_shared_experts": 1, "first_k_dense_replace": 1, "decoder_sparse_step": 1,
    "n_group": 1, "topk_group": 1, "max_position_embeddings": 512, "n_positions": 512, "seq_length": 512,
    "q_lora_rank": 32, "kv_lora_rank": 32, "qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16,
    "sliding_window": 64, "num_nextn_predict_layers": 1, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 16, "linear_value_head_dim": 16, "global_head_dim": 16,
}
# architecture -> config fields vLLM's model code reads to build another attention when they are absent or null: the
# profile builds the model again without them and records its modules (`without`), which doctor takes for a config
# lacking them. Qwen4Exp: no indexer_n_heads, no QSA: Qwen3NextAttention, whose q/k/v take the quant config
# (qwen4_exp/nvidia/model.py:243-251; the QSA linear drops ModelOpt FP4, model.py:104 without_modelopt_fp4)
WITHOUT: dict[str, tuple[str, ...]] = {
    "Qwen4ExpForCausalLM": ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget",
                            "indexer_compress_ratio"),
}
# architecture -> the value rules transformers' config class enforces on WITHOUT's fields when they are set, in the
# order its validator checks them (Qwen4ExpConfig.validate_architecture, transformers 5.19 configuration_qwen4_exp.py:
# 214-219: every value > 0, indexer_kv_heads == 1, indexer_budget a multiple of indexer_compress_ratio). A rule is a
# hypothesis read from that code: tools/vllm_config_refusals.py asks vLLM's own config loading with its two probes
# (each breaking that rule alone) and records it, in vLLM's words, only where vLLM refuses both. Doctor evaluates a
# recorded rule on the config: `at_least` N, `equals` N, `multiple_of` another field.
_QSA = WITHOUT["Qwen4ExpForCausalLM"]
VALUE_RULES: dict[str, tuple[dict, ...]] = {
    "Qwen4ExpForCausalLM": (
        *({"field": f, "at_least": 1, "probes": [{f: 0}, {f: -1}]} for f in _QSA),
        {"field": "indexer_kv_heads", "equals": 1, "probes": [{"indexer_kv_heads": 2}, {"indexer_kv_heads": 3}]},
        {"field": "indexer_budget", "multiple_of": "indexer_compress_ratio",
         "probes": [{"indexer_budget": 2049}, {"indexer_budget": 2050}]},
    ),
}
DROP = ("architectures", "auto_map", "transformers_version", "dtype", "torch_dtype", "quantization_config")
SUB_CONFIGS = ("text_config", "language_config", "llm_config", "thinker_config")
# a multimodal class's (vLLM's _MULTIMODAL_MODELS) other sub-configs, shrunk too: its towers and projector are built
# and profiled with the language model. A vision_config the class defaults to None (Gemma 4) is built from its class
# (published image-text checkpoints carry one: tests/data/real/gemma-4-31b-it-nvfp4); an audio_config left None stays
TOWERS = ("vision_config",)
# multimodal classes the small config does not fit: their config class refuses the sizes SMALL shrinks its sub-configs
# to (its validator, raised in huggingface_hub's strict dataclass: our sizes' fault, so the generator would stop on
# it), or they stay too large to build here: not profiled, said so.
# Measured with transformers 5.19 (vLLM 0.32 venv)
UNSHRUNK: dict[str, str] = {
    "Cosmos3EdgeForConditionalGeneration": "its text config's mrope_section [24, 20, 20] must sum to half of head_dim",
    "Glm5NextForConditionalGeneration": "its text config asks num_attention_heads == num_key_value_heads",
    # not a refusal: its talker and token2wav sub-configs' own sub-configs keep their sizes, and the build took 15 GB
    "Qwen2_5OmniForConditionalGeneration": "its talker / token2wav sub-configs are not shrunk: building it takes 15 GB",
}
# size keys only a tower's config spells so (Qwen-VL's depth / num_heads / out_hidden_size, Whisper-style audio
# encoders' d_model / encoder_*), set in those sub-configs alone: the text rows' configs keep SMALL's keys only
TOWER_SMALL = {"depth": 2, "num_heads": 4, "out_hidden_size": 64, "d_model": 64, "encoder_layers": 2,
               "encoder_attention_heads": 4, "encoder_ffn_dim": 128, "embed_dim": 64}


# architecture -> the transformers class that writes its checkpoints and whose config class reads its config.json, where
# vLLM registers the architecture under that class by another spelling. ExaoneMoEForCausalLM: K-EXAONE's listed name,
# registered as ("exaone_moe", "ExaoneMoeForCausalLM") (vllm/model_executor/models/registry.py); vLLM's own test registry
# loads its example LGAI-EXAONE/K-EXAONE-236B-A23B without trust_remote_code from transformers 5.1.0 on
# (tests/models/registry.py, vllm-project/vllm@0008d3565e9e73f132383fc09ce4b98e396eaed4): no config class but
# transformers' (exaone_moe: ExaoneMoeConfig, the only one vLLM or transformers ships for it) reads that config
WRITTEN_AS: dict[str, str] = {"ExaoneMoEForCausalLM": "ExaoneMoeForCausalLM"}


def written_as(arch: str) -> str:
    """The transformers class name whose config class and save_pretrained stand for `arch` (WRITTEN_AS, else itself)."""
    return WRITTEN_AS.get(arch, arch)


class NoConfig(Exception):
    """The architecture has no config we can build (the message says why)."""


def model_types() -> dict[str, str]:
    """transformers' class name -> model_type, from every auto-model mapping it ships."""
    from transformers.models.auto import modeling_auto

    out: dict[str, str] = {}
    first = ["MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"]  # a *ForCausalLM class is its text model's (llama4_text, not llama4)
    for name in first + sorted(dir(modeling_auto)):
        table = getattr(modeling_auto, name)
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES") and isinstance(table, dict):
            for model_type, classes in table.items():
                for cls in (classes if isinstance(classes, (list, tuple)) else [classes]):
                    if cls not in out or model_type.endswith("_text"):  # the text model's own type (llama4_text)
                        out[cls] = model_type
    return out


def _shrunk(cls, overrides: dict | None = None, towers: bool = False, tower: bool = False) -> dict:
    """`towers`: a multimodal class's, whose tower sub-configs are shrunk too; `tower`: one of those (TOWER_SMALL)."""
    defaults = cls().to_dict()
    kwargs = {k: v for k, v in (SMALL | TOWER_SMALL if tower else SMALL).items() if k in defaults
              and (defaults[k] is None or isinstance(defaults[k], int))
              and not (defaults[k] is None and k in ("q_lora_rank", "sliding_window", "num_nextn_predict_layers"))}
    for key, sub in getattr(cls, "sub_configs", {}).items():
        if key in SUB_CONFIGS:  # (a text-generation class's AutoConfig sub-config stays refused, as it was)
            kwargs[key] = _shrunk(_sub_class(sub, defaults.get(key)) if towers else sub)
        elif towers and (defaults.get(key) is not None or key in TOWERS):
            kwargs[key] = _shrunk(_sub_class(sub, defaults.get(key)), tower=True)
    if "num_hidden_layers" in kwargs and defaults.get("full_attention_interval"):
        kwargs["num_hidden_layers"] = defaults["full_attention_interval"]  # one full-attention layer among them
    kwargs.update(_per_layer_lists(defaults, kwargs, overrides or {}))
    kwargs.update(_token_ids_inside(defaults, kwargs.get("vocab_size")))
    kwargs.update({k: v for k, v in (overrides or {}).items() if k in defaults})
    config = cls(**kwargs).to_dict()
    _drop_bookkeeping(config)
    if "num_attention_heads" in kwargs and "head_dim" not in config and "hidden_size" in kwargs and not hasattr(cls, "head_dim"):
        config["head_dim"] = kwargs["hidden_size"] // kwargs["num_attention_heads"]  # vLLM reads it where real configs hold it
    for key in DROP:
        config.pop(key, None)
    return config


def _sub_class(sub, default):
    """The config class of a sub-config: its own, or, where the class names AutoConfig (Mistral 3's vision_config), the
    one transformers registers for the default's model_type."""
    from transformers import CONFIG_MAPPING

    if sub.__name__ == "AutoConfig" and isinstance(default, dict) and default.get("model_type") in CONFIG_MAPPING:
        return CONFIG_MAPPING[default["model_type"]]
    return sub


def _per_layer_lists(defaults: dict, kwargs: dict, overrides: dict) -> dict:
    """The class's per-layer lists (layer_types, mlp_layer_types, layers_block_type, ...: one entry per default layer)
    cut to the layers that show each kind once, in order, and the layer count set to match (a class validates its
    lists' length against num_hidden_layers; a 2-layer model would otherwise hold only its first two kinds)."""
    count_key = next((k for k in ("num_hidden_layers", "num_layers", "n_layers") if isinstance(defaults.get(k), int)), None)
    if count_key is None or count_key not in kwargs:
        return {}
    n = defaults[count_key]
    lists = {k: v for k, v in defaults.items() if isinstance(v, list) and len(v) == n and n > 2 and k not in overrides
             and all(isinstance(x, (str, int, float)) for x in v)}
    keep: set[int] = {0, 1}
    for values in lists.values():
        keep |= {values.index(x) for x in dict.fromkeys(values)}
    rows = sorted(keep)
    if not lists:
        return {}
    return {count_key: len(rows), **{k: [v[i] for i in rows] for k, v in lists.items()}}


def _token_ids_inside(defaults: dict, vocab: int | None) -> dict:
    """The class's default special-token ids (pad_token_id, bos/eos, ...) that lie past the shrunk vocabulary, brought
    to its last id: transformers' embedding asserts padding_idx < num_embeddings (Glm4, Phi3, OlmoHybrid, HYV4 default
    pad ids past 256). Token ids are no tensor sizes: vLLM builds the same modules either way."""
    if not isinstance(vocab, int):
        return {}
    def inside(v):
        if isinstance(v, list):
            return [inside(x) for x in v]
        return vocab - 1 if isinstance(v, int) and not isinstance(v, bool) and v >= vocab else v
    return {k: inside(v) for k, v in defaults.items() if k.endswith("_token_id") and inside(v) != v}


def _drop_bookkeeping(config: dict) -> None:
    """PretrainedConfig bookkeeping (also in nested sub-config dicts), which vLLM's validation refuses as unknown kwargs."""
    for key in [k for k in config if isinstance(k, str) and k.startswith("_")] + ["output_attentions", "output_hidden_states", "return_dict"]:
        config.pop(key, None)
    for value in config.values():
        if isinstance(value, dict):
            _drop_bookkeeping(value)


# Config fields where transformers' class and vLLM's model file read the same config into different layers, set to
# the branch on which both build the same tensors (the one published checkpoints take: transformers' class always
# writes these tensors). Config values, not tensor names: the names still come from transformers' save_pretrained.
# The profile builds transformers' class with them too (its checkpoint names, not vLLM's build).
# Provenance: vLLM 0.32 model files (lines), transformers 5.19 classes.
# architectures whose published names are not what transformers' class writes, and are what vLLM's hf_to_vllm_mapper is
# written for: the profile reads vLLM's own names back through that mapper (vllm_saved_names.published_checkpoint) and
# vLLM's own loader must take them. DeepSeek-V4: published `layers.N.*`, `embed.weight`, `head.weight`, `hc_head_*`,
# `mtp.*` (nvidia/DeepSeek-V4-Flash-NVFP4's hf_quant_config.json names `layers.N.ffn.experts`, `head`, `mtp.*`:
# tests/data/real; SGLang 0.5.23 reads the same, models/deepseek_v4.py:5113-5180), which vLLM 0.32's mapper maps
# (models/deepseek_v4/nvidia/model.py:1712-1755); transformers 5.19's save_pretrained keeps its `model.` prefix, and
# its conversion mapping writes the attention's `kv_norm` back as `attn.norm` (its `\.norm\.` -> `.kv_norm.` renaming
# is the compressor's; measured: vLLM's loader then stops at KeyError 'layers.0.attn.norm.weight')
MAPPER_LAYOUT = frozenset({"DeepseekV4ForCausalLM"})
PUBLISHED: dict[str, dict] = {
    # deepseek_v2.py:327 builds gate.e_score_correction_bias only for topk_method "noaux_tc" (DeepSeek-V3's config)
    "DeepseekV3ForCausalLM": {"topk_method": "noaux_tc"},
    # minimax_m2.py:85 builds e_score_correction_bias only if use_routing_bias (MiniMax-M2's config sets it)
    "MiniMaxM2ForCausalLM": {"use_routing_bias": True},
    "HYV3ForCausalLM": {"qk_norm": True},  # hy_v3.py:260 builds q_norm/k_norm only if qk_norm
    # gemma4.py:630 builds the MoE block when num_experts is set; transformers' class when enable_moe_block
    "Gemma4ForCausalLM": {"enable_moe_block": True},
    "FalconForCausalLM": {"ffn_hidden_size": None},  # falcon.py:237 builds 4 * hidden_size; transformers derives it so
    # AXK1.py:643 builds post_mlp_layernorm in every layer; transformers' class only in its MoE blocks (its conversion
    # mapping renames post_mlp_layernorm into mlp.): an all-MoE stack is the layout both hold. transformers 5.25's
    # AXK1Config derives its layers from first_k_dense_replace only where mlp_layer_types is null
    # (configuration_axk1.py:125-129): the shrunk config's list (layer 0 dense) is dropped, else its class writes a
    # dense layer 0 that vLLM's own AXK1Config (first_k_dense_replace 0) builds MoE: a KeyError, not the release's
    "AXK1ForCausalLM": {"first_k_dense_replace": 0, "mlp_layer_types": None},
    # zamba2.py:165 builds the shared attention's qkv_proj with as many K/V heads as query heads (no kv-head count)
    "Zamba2ForCausalLM": {"num_key_value_heads": 4},  # = SMALL's num_attention_heads
    # vLLM 0.28/0.30 phi.py build qkv_proj with as many K/V heads as query heads (:94) and fc1 4 * hidden_size wide
    # (:148, no n_inner); published Phi configs (phi-1, phi-1_5, phi-2) are both: num_key_value_heads null (MHA),
    # intermediate_size 4 * hidden_size. (0.32 registers Phi on its Transformers backend: not profiled there)
    "PhiForCausalLM": {"num_key_value_heads": 4, "intermediate_size": 256},  # SMALL's heads; 4 * its hidden_size
    # vLLM 0.28 hunyuan_v1.py:225 builds query/key_layernorm only if use_qk_norm, which published Hunyuan dense configs
    # (tencent/Hunyuan-7B-Instruct) set; transformers' class always builds them (modeling_hunyuan_v1_dense.py:180)
    "HunYuanDenseV1ForCausalLM": {"use_qk_norm": True},
    # the class's default 15 KV-shared layers (of 35) outnumber the 4 kept; transformers' class then finds no earlier
    # layer of a shared layer's kind. One shared layer is the smallest layout that keeps KV sharing
    "Gemma3nForCausalLM": {"num_kv_shared_layers": 1},
    # deepseek_v2.py:327 builds gate.e_score_correction_bias only for topk_method "noaux_tc", a field neither
    # transformers class has (vLLM reads them as vllm/transformers_utils/config.py:92 DeepseekV3Config and transformers'
    # GlmMoeDsaConfig), while transformers' classes always build the bias: DeepSeek-V3.2's config sets it (as every
    # DeepSeek-V3 config); GLM-5's is inferred, not read here: without it vLLM 0.32 loads no GLM-5 checkpoint (KeyError
    # on the bias: this generator's load_refused before the field)
    **{a: {"topk_method": "noaux_tc"} for a in ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")},
}


def vllm_config_class(arch: str) -> tuple[type | None, dict]:
    """(the config class vLLM itself ships for `arch`, or None unless exactly one; class -> model_type of vLLM's config
    registry, vllm/transformers_utils/config.py `_CONFIG_REGISTRY`). A candidate is a registered class of vLLM's
    own (vllm/transformers_utils/configs/) that the architecture's model module imports, at run time or for its
    annotations (chatglm.py: ChatGLMConfig; step3p5.py: Step3p5Config under TYPE_CHECKING), or whose `architectures`
    names it (Step3TextConfig). Learned from vLLM's code, never a table here."""
    import ast
    import importlib.util
    from pathlib import Path

    from vllm.transformers_utils import configs
    from vllm.transformers_utils.config import _CONFIG_REGISTRY

    registered: dict = {}
    for model_type in list(dict.keys(_CONFIG_REGISTRY)):
        try:
            cls = _CONFIG_REGISTRY[model_type]
        except (ImportError, AttributeError):  # a config module that does not import here: not a candidate
            continue
        if cls.__module__.startswith(f"{configs.__name__}."):
            registered.setdefault(cls, model_type)
    module_name = registered_module(arch)
    spec = importlib.util.find_spec(module_name if module_name.startswith("vllm.")
                                    else f"vllm.model_executor.models.{module_name}")
    imported: set[tuple[str, str]] = set()  # (the module imported from, absolute; the name imported)
    source = spec.origin if spec and spec.origin and spec.origin.endswith(".py") else None  # not a compiled module
    for node in ast.walk(ast.parse(Path(source).read_text())) if source else ():
        if isinstance(node, ast.ImportFrom):  # `from ...transformers_utils.configs import X` resolved from its package
            try:
                origin = importlib.util.resolve_name("." * node.level + (node.module or ""), spec.parent)
            except ImportError:  # a relative import past the top-level package: it imports nothing
                continue
            imported |= {(origin, alias.name) for alias in node.names}
    found = {c for c in registered if {(configs.__name__, c.__name__), (c.__module__, c.__name__)} & imported
             or arch in _listed(getattr(c, "architectures", None))}
    return (found.pop() if len(found) == 1 else None), registered


REMOTE = ("transformers ships no model class of this name, nor vLLM a config class its model reads (its config comes "
          "with remote code)")


def _remote(arch: str) -> tuple[dict, str, dict]:
    """tools/vllm_remote_configs.py's config learned from vLLM's own model code, or NoConfig saying why not."""
    import tempfile

    from vllm import ModelRegistry
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm_profile import build_model, modules_of, write_config
    from vllm_remote_configs import remote_config

    model_class = ModelRegistry._try_load_model_cls(arch)
    if model_class is None:
        raise NoConfig("vLLM cannot import its model class here (a GPU-only or missing dependency)")
    ModelRegistry.register_model(arch, model_class)  # in-process, as the profile builds it

    def build(config: dict) -> tuple[Exception | None, dict]:
        with tempfile.TemporaryDirectory() as folder:
            write_config(folder, arch, config, [])
            try:
                model, _ = build_model(folder, initialize_model)
            except Exception as e:  # noqa: BLE001 - the learner reads the error: a field to answer, or the reason
                reraise_ours(e)
                return e, {}
        return None, modules_of(model)

    try:
        return remote_config(arch, build)
    except NoConfig as e:
        raise NoConfig(f"{REMOTE}; {e}") from None


def multimodal(arch: str) -> bool:
    """Whether vLLM registers `arch` as a multimodal model (its towers are profiled too)."""
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS

    return arch in _MULTIMODAL_MODELS


def registered_module(arch: str) -> str:
    """The module vLLM's registry names for `arch` (text-generation or multimodal)."""
    from vllm.model_executor.models.registry import _MULTIMODAL_MODELS, _TEXT_GENERATION_MODELS

    return {**_MULTIMODAL_MODELS, **_TEXT_GENERATION_MODELS}[arch][0]


def _listed(value) -> tuple:
    """A config class's `architectures` as names: a list or tuple of them, never a string to search in."""
    return tuple(value) if isinstance(value, (list, tuple)) else ()


def small_config(arch: str, names: dict[str, str]) -> tuple[dict, str, dict]:
    """(config.json contents without architectures, where it came from, the defaults that chose a learned config's layers) for a registered architecture: transformers'
    config class for it, else the one vLLM ships (`vllm_config_class`), else one learned from what vLLM's own model
    code reads (tools/vllm_remote_configs.py: the config comes with remote code only)."""
    import transformers
    from transformers import CONFIG_MAPPING

    if arch in UNSHRUNK:
        raise NoConfig(f"not profiled here: {UNSHRUNK[arch]} (a limit of tools/vllm_profile_configs.py's small "
                       "config, not vLLM's)")
    model_type, owner = names.get(written_as(arch)), f"transformers {transformers.__version__}"
    if model_type is None:
        cls, registered = vllm_config_class(arch)
        mistral = mistral_format(arch) if cls is None else None
        if mistral is not None:
            return mistral
        if cls is None:
            return _remote(arch)
        model_type, owner = registered[cls], f"vLLM's own ({cls.__module__})"
    elif model_type in CONFIG_MAPPING:
        cls = CONFIG_MAPPING[model_type]
    else:
        raise NoConfig(f"transformers has no config class for model_type {model_type!r}")
    towers = multimodal(arch)
    try:
        config = _shrunk(cls, EXTRA.get(arch), towers)
    except Exception as e:  # noqa: BLE001 - the class refused our sizes: a reason, not a crash
        if not (towers and type(e).__name__ == "StrictDataclassClassValidationError"):  # (as UNSHRUNK's, said so)
            reraise_ours(e)
        raise NoConfig(f"{owner} {cls.__name__} refuses the shrunk sizes: {type(e).__name__}: {str(e)[:160]}") from None
    config["model_type"] = model_type
    for key, value in EXTRA.get(arch, {}).items():  # "sub.key": a field of a sub-config (text_config)
        parent, _, child = key.rpartition(".")
        (config.setdefault(parent, {}) if parent else config)[child] = value
    return config, f"{owner} {cls.__name__}, shrunk (tools/vllm_profile_configs.py SMALL)", {}
