"""The SGLang rules per release, as found by diffing the wheels (tools/sglang_rules_data.py writes them out).

Each release row names the registry's matchers (repair/targets/matchers.py) and a marker text per source file that
the wheel must contain, so the row is re-checked against the wheel whenever the data is regenerated.
"""

from __future__ import annotations

UTILS = "sglang/srt/layers/quantization/utils.py"
MODELOPT = "sglang/srt/layers/quantization/modelopt_quant.py"
CT_UTILS = "sglang/srt/layers/quantization/compressed_tensors/utils.py"
MODEL_CONFIG = "sglang/srt/configs/model_config.py"
LOADER = "sglang/srt/model_loader/loader.py"  # where the DeepSeek-V4 fp8 form becomes HybridFp8NvFp4Config
MOE_LAYER = "sglang/srt/layers/moe/fused_moe_triton/layer.py"
SKIP_MIX = ("ValueError: Detected some but not all shards of {prefix} are quantized. All shards of fused layers to "
            "have the same precision.")
W4AFP8 = "SGLang {release} reads quant_algo MIXED_PRECISION as w4afp8 (W4A8 experts), not as per-layer NVFP4/FP8"
# 0.5.10-0.5.14 _parse_modelopt_quant_config: MIXED_PRECISION is modelopt_mixed where `hf_config.model_type == "nemotron_h"`
# or an architecture starts with NemotronH (0.5.13 model_config.py:1022-1028), w4afp8 for every other class
NEMOTRON_H = {"MIXED_PRECISION": {"model_types": ["nemotron_h"], "architecture_prefixes": ["NemotronH"]}}
NEMOTRON_H_MARKER = 'arch.startswith("NemotronH") for arch in architectures'
ONLY_FP8_NVFP4 = ("ValueError: ModelOpt currently only supports: FP8, NVFP4 quantizations in sglang. Please check the "
                  "quantization config for your model's configuration.")
# ModelOptFp4Config.from_config's `if quant_method not in [...]: raise ValueError(...)` (0.5.17 modelopt_quant.py:1356)
ONLY_FP8_NVFP4_AWQ = ("ValueError: ModelOpt currently only supports: FP8, NVFP4, NVFP4_AWQ quantizations in sglang. Please "
                      "check the quantization config for your model's configuration.")

LM_HEAD_COPY = ("RuntimeError: The size of tensor a ({param_cols}) must match the size of tensor b ({loaded_cols}) at "
                "non-singleton dimension 1")

COMMON = {
    "display": "SGLang",  # how messages name the runtime
    "follows_draft_config": True,  # MTP/NextN from the target's config; EAGLE-3 reads its own (model_config.py)
    "layer_rows": "vllm==0.32.0",  # architecture facts (layer roles, model fusions) borrowed from this profile
    "fused": {"policy": "raise_on_listed_mix", "error": SKIP_MIX,
              "wildcard": "built quantized; the BF16 shard then fails its shape check"},
    "unknown_tensors": {"policy": "log_skip", "text": "Parameter {name} not found in params_dict"},
    "loaders": {  # layers/linear.py, parameter.py, utils/common.py pad_or_narrow_weight (CUDA path; probed on CPU)
        "row_parallel": {"packed_into_bf16": "zero_pad", "bf16_into_packed": "silent_cast"},
        "merged_column": {"packed_into_bf16": "AssertionError", "bf16_into_packed": "AssertionError"},
        "qkv": {"packed_into_bf16": "AssertionError: param_data.shape={param} loaded_weight.shape={loaded}",
                "bf16_into_packed": "AssertionError: param_data.shape={param}, loaded_weight.shape={loaded}"},
        "column_parallel": {"packed_into_bf16": "AssertionError: param_data.shape={param} != loaded_weight.shape={loaded}",
                            "bf16_into_packed": "AssertionError: target.shape={param}, loaded_weight.shape={loaded}"},
        "replicated": {"packed_into_bf16": "AssertionError: param.shape={param} param.dtype={pdtype} "
                                           "loaded_weight.shape={loaded} loaded_weight.dtype={ldtype}",
                       "bf16_into_packed": "AssertionError: target.shape={param}, loaded_weight.shape={loaded}"},
        # vocab_parallel_embedding.py weight_loader: narrows the vocab rows, then copy_ (a width mismatch is copy_'s)
        "lm_head": {"packed_into_bf16": LM_HEAD_COPY, "bf16_into_packed": LM_HEAD_COPY},
        # model_loader/weight_utils.py default_weight_loader (a plain torch.nn.Linear: `plain_layers`)
        "plain": {"packed_into_bf16": "AssertionError: Attempted to load weight ({loaded}) into parameter ({param})"},
    },
    "draft": {  # models/*nextn*.py, *_mtp.py: the MTP/NextN draft's quant config, by the target's architecture
        "mtp": [
            {"architectures": ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM"],
             "layers": "model.layers.{num_hidden_layers}.", "bf16_when": ["modelopt_fp4"],
             "source": "models/deepseek_nextn.py: quant_config = None for modelopt_fp4"},
            {"architectures": ["Glm4MoeForCausalLM"], "layers": "model.layers.{num_hidden_layers}.",
             "bf16_when": ["modelopt_fp4"], "source": "models/glm4_moe_nextn.py: quant_config = None for modelopt_fp4"},
            {"architectures": ["Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM", "Qwen3_5ForConditionalGeneration",
                               "Qwen3_5MoeForConditionalGeneration"], "layers": "mtp.",
             "bf16_when": ["modelopt_fp4", "modelopt_mixed_without_mtp_keys"],
             "source": "models/qwen3_5_mtp.py: _mtp_quant_config"},
        ],
    },
    # the model code's names for fused layers the layer rows name otherwise (models/deepseek_v2.py: ReplicatedLinear)
    "fusion_names": {"fused_qkv_a_proj": "fused_qkv_a_proj_with_mqa"},
    # the layer rows' classes -> the loader family that loads them (layers/linear.py, vocab_parallel_embedding.py)
    "layer_classes": {"RowParallelLinear": "row_parallel", "MergedColumnParallelLinear": "merged_column",
                      "QKVParallelLinear": "qkv", "ColumnParallelLinear": "column_parallel",
                      "ReplicatedLinear": "replicated", "ParallelLMHead": "lm_head"},
    "row_parallel_leaves": ["o_proj", "down_proj", "dense", "out_proj", "dense_4h_to_h", "wo", "w2", "c_proj", "fc2"],
    "errors": {"in_features_16": "ValueError: Unsupported model when in features size is not multiple of 16"},
}

# Packed mappings a model class adds in __init__ from the config: models/deepseek_v2.py DeepseekV2ForCausalLM.__init__
# adds fused_qkv_a_proj_with_mqa when q_lora_rank is set, into the class-level dict the quant config already holds
# (model_loader/loader.py _get_quantization_config and weight_utils.get_quant_config pass that same object; 0.5.23
# also calls quant_config.update_packed_modules_mapping). Applies to every registered architecture that runs that
# __init__ (not DeepseekV3ForCausalLMNextN, which has its own); the marker must be in the wheel's file.
CONFIG_PACKED = {
    "DeepseekV2ForCausalLM": {
        "file": "sglang/srt/models/deepseek_v2.py",
        "marker": 'self.packed_modules_mapping["fused_qkv_a_proj_with_mqa"] = [',
        "when": "q_lora_rank",
        "add": {"fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]},
    },
}

# configs/model_config.py _parse_quant_hf_config: config.json's ModelOpt quantization_config in the nested form
# ({"quantization": {...}}) gets quant_method/quant_algo merged in at its top level, so ModelOptFp4Config.from_config
# takes its flat branch, which reads exclusions from the top level only: the nested exclude_modules are dropped.
NESTED_CONFIG_JSON = {"methods": ["modelopt_fp4"], "file": "sglang/srt/configs/model_config.py",
                      "marker": "quant_cfg.update(parsed_cfg)"}
# ModelOptFp4Config.from_config: the exclusion list it reads (config.json quantization_config's top level, nested
# form included since model_config.py merges quant_algo there; else hf_quant_config.json's quantization.exclude_modules)
# present but null leaves exclude_modules None, and it raises while reading the config, before any layer is built.
# The error text is the wheel's (the marker); ModelOptFp8Config does `exclude_modules or []` instead.
NULL_EXCLUSIONS = {"methods": ["modelopt_fp4"], "file": MODELOPT,
                   "marker": "NVFP4 quantization requires group_size and exclude_modules ",
                   "error": ("ValueError: NVFP4 quantization requires group_size and exclude_modules specified in the "
                             "quantization config")}
# Layers a model builds as a plain torch.nn.Linear (never quantized, whatever the lists say), by architecture
PLAIN_LAYERS = {"LlamaForCausalLMEagle3": {"layers": ["fc"], "file": "sglang/srt/models/llama_eagle3.py",
                                           "marker": "self.fc = torch.nn.Linear("}}

# The code a row's rules were read from: whole files, or the functions (`Class.method`) of one. A release whose row is
# `{"same_as": R}` takes R's row only where every unit is the same code (ast) in both wheels (tools/sglang_rules_data.py
# checks it, given both; anything else stops the tool: read that release anew).
RULE_CODE = {UTILS: None, CT_UTILS: None,
             MODEL_CONFIG: ("ModelConfig._parse_quant_hf_config", "ModelConfig._parse_modelopt_quant_config",
                            "ModelConfig._get_modelopt_quant_type", "ModelConfig._verify_quantization"),
             MODELOPT: ("ModelOptQuantConfig.is_layer_excluded", "ModelOptQuantConfig._get_quant_method",
                        "ModelOptQuantConfig.__init__", "ModelOptFp8Config.from_config", "ModelOptFp4Config.__init__",
                        "ModelOptFp4Config.from_config", "ModelOptFp4Config.get_quant_method",
                        "ModelOptMixedPrecisionConfig.__init__", "ModelOptMixedPrecisionConfig.from_config",
                        "ModelOptMixedPrecisionConfig._resolve_quant_algo",
                        "ModelOptMixedPrecisionConfig._quantized_layer_prefix_candidates",
                        "ModelOptMixedPrecisionConfig.resolve_quant_algo",
                        "ModelOptMixedPrecisionConfig.get_quant_method")}


def _later_row(ct: str, layers: str, refused: dict, modelopt_marker: str,
               config_marker: str = "has_modelopt_nvfp4_layers") -> dict:
    """A 0.5.13-0.5.22 row: the stripping dotted ModelOpt rule and the fused fallback of every one of them, the
    compressed-tensors and quantized_layers rules and refusals that change, each marker checked against the wheel."""
    return {"matchers": {"modelopt": "sglang_modelopt_dotted", "compressed-tensors": ct, "quantized_layers": layers},
            "fallback_fused": True, "refused_algorithms": refused,
            **({"refused_spared": NEMOTRON_H} if config_marker == NEMOTRON_H_MARKER else {}),
            "markers": {UTILS: 'ignored = ignored.rstrip(".")', MODELOPT: modelopt_marker, MODEL_CONFIG: config_marker,
                        CT_UTILS: 'layer_name.endswith("." + target)' if ct == "sglang_ct_suffix" else "check_contains=True"}}

RULES = {
    "0.5.9": {
        "matchers": {"modelopt": "sglang_modelopt_substring_experts_only", "compressed-tensors": "sglang_ct_contains",
                     "quantized_layers": "none"},
        "fallback_fused": False,
        "refused_algorithms": {"MIXED_PRECISION": W4AFP8.format(release="0.5.9"), "NVFP4_AWQ": ONLY_FP8_NVFP4,
                               "W4A16_NVFP4": ONLY_FP8_NVFP4},
        "markers": {UTILS: "is_skipped = any(ignored in prefix for ignored in ignored_layers)",
                    CT_UTILS: "check_contains=True", MODEL_CONFIG: '"quant_method": "w4afp8"'},
    },
    "0.5.10": {
        "matchers": {"modelopt": "sglang_modelopt_substring", "compressed-tensors": "sglang_ct_contains",
                     "quantized_layers": "sglang_layers_exact"},
        "fallback_fused": False,
        "refused_algorithms": {"MIXED_PRECISION": W4AFP8.format(release="0.5.10")},
        "refused_spared": NEMOTRON_H,
        "markers": {UTILS: "is_skipped = any(ignored in prefix for ignored in ignored_layers)",
                    CT_UTILS: "check_contains=True", MODELOPT: "def _resolve_quant_algo", MODEL_CONFIG: NEMOTRON_H_MARKER},
    },
    "0.5.11": {  # _module_path_match compares entry and prefix as written (utils.py:46-55; 0.5.13 strips a trailing .)
        "matchers": {"modelopt": "sglang_modelopt_dotted_as_written", "compressed-tensors": "sglang_ct_contains",
                     "quantized_layers": "sglang_layers_exact"},
        "fallback_fused": True,
        "refused_algorithms": {"MIXED_PRECISION": W4AFP8.format(release="0.5.11")},
        "refused_spared": NEMOTRON_H,
        "markers": {UTILS: "_FALLBACK_FUSED_SHARDS", CT_UTILS: "check_contains=True", MODELOPT: "def _resolve_quant_algo",
                    MODEL_CONFIG: NEMOTRON_H_MARKER},
    },
    "0.5.12": {"same_as": "0.5.11"},  # every RULE_CODE unit as 0.5.11's (modelopt_quant.py differs elsewhere)
    # 0.5.13-0.5.22, each read anew from its wheel (every one's RULE_CODE differs from the release before it: see
    # docs/runtime_profiles.md "SGLang 0.5.13-0.5.22"). Rules that change, with the release that changes them:
    # - is_layer_skipped: _module_path_match strips a trailing `.` (0.5.13 utils.py:53-54), as 0.5.23;
    # - ModelOptFp4Config.from_config refuses a quant_algo outside its list: [FP8, NVFP4] to 0.5.16 (0.5.13
    #   modelopt_quant.py:1305), + NVFP4_AWQ in 0.5.17/0.5.18 (0.5.17:1356), + W4A16_NVFP4 from 0.5.19;
    # - model_config.py _parse_modelopt_quant_config reads MIXED_PRECISION as w4afp8 to 0.5.14 (NemotronH aside), as
    #   modelopt_mixed from 0.5.15 where a quantized_layers entry is NVFP4/W4A16_NVFP4 (0.5.15 model_config.py);
    # - _resolve_quant_algo asks _quantized_layer_prefix_candidates from 0.5.15 (lm_head, the VL text stack's two
    #   spellings), + `model.` <-> `model.language_model.` from 0.5.20;
    # - should_ignore_layer: plain entries as a substring to 0.5.16, exact or dotted suffix from 0.5.17
    #   (compressed_tensors/utils.py check_equal_or_regex_match).
    # is_layer_excluded's globs are the same function in every one (0.5.22 compiles them through an lru_cache).
    **{r: _later_row("sglang_ct_contains", "sglang_layers_exact",
                     {"MIXED_PRECISION": W4AFP8.format(release=r), "NVFP4_AWQ": ONLY_FP8_NVFP4, "W4A16_NVFP4": ONLY_FP8_NVFP4},
                     'if not quant_method in ["FP8", "NVFP4"]:', NEMOTRON_H_MARKER)
       for r in ("0.5.13", "0.5.14")},
    **{r: _later_row("sglang_ct_contains", "sglang_layers_language_swaps",
                     {"NVFP4_AWQ": ONLY_FP8_NVFP4, "W4A16_NVFP4": ONLY_FP8_NVFP4}, 'if quant_method not in ["FP8", "NVFP4"]:')
       for r in ("0.5.15", "0.5.16")},
    **{r: _later_row("sglang_ct_suffix", "sglang_layers_language_swaps", {"W4A16_NVFP4": ONLY_FP8_NVFP4_AWQ},
                     'if quant_method not in ["FP8", "NVFP4", "NVFP4_AWQ"]:') for r in ("0.5.17", "0.5.18")},
    "0.5.19": _later_row("sglang_ct_suffix", "sglang_layers_language_swaps", {}, '"W4A16_NVFP4"]:'),
    **{r: _later_row("sglang_ct_suffix", "sglang_layers_aliases", {},
                     'candidates.append("model.language_model." + prefix[len("model.") :])') for r in ("0.5.20", "0.5.21", "0.5.22")},
    "0.5.23": {
        # deepseek_v4_fp8: DeepSeek-V4's published fp8 form, HybridFp8NvFp4Config (model_loader/loader.py:222-247;
        # repair/targets/sglang_dsv4_fp8.py cites the rest; tests/sglang/test_dsv4_fp8_vs_sglang.py builds the model)
        "matchers": {"modelopt": "sglang_modelopt_dotted", "compressed-tensors": "sglang_ct_suffix",
                     "quantized_layers": "sglang_layers_aliases", "deepseek_v4_fp8": "sglang_dsv4_fp8_hybrid"},
        "fallback_fused": True,
        "refused_algorithms": {},
        # model_loader/loader.py loads what the checkpoint stores and checks nothing left unfilled: a fused layer's
        # absent shard (its rows) or an absent norm keeps torch.empty memory, no error (the SGLang tier,
        # tests/sglang/test_missing_shard_vs_sglang.py, loads both at TP 2)
        "missing_weights": {"linear": "unchecked", "norm": "unchecked"},
        # FusedMoE.weight_loader per expert shard (layers/moe/fused_moe_triton/layer.py _load_w13 / _load_w2): with the
        # runner ModelOptNvFp4FusedMoEMethod.create_moe_runner picks by default off SM80-SM99 (flashinfer_trtllm:
        # Blackwell; Marlin on Ampere/Hopper does not pad, and there down_proj raises copy_'s error as well), its
        # padded loading (narrow_padded_param_and_loaded_weight) w13 narrows the rows and copies whole
        # rows, so another width is copy_'s RuntimeError; w2 narrows the columns to the parameter's width: a BF16
        # down_proj is cast into the packed uint8, a packed one zero-padded into BF16 (all zeros past the packed
        # width's ranks). Checked expert by expert by tests/sglang/test_routed_experts_vs_sglang.py.
        "loaders_added": {"moe_w13": {"packed_into_bf16": LM_HEAD_COPY, "bf16_into_packed": LM_HEAD_COPY},
                          "moe_w2": {"packed_into_bf16": "zero_pad", "bf16_into_packed": "silent_cast"}},
        "markers": {UTILS: "_FALLBACK_FUSED_SHARDS", CT_UTILS: 'layer_name.endswith("." + target)',
                    MODELOPT: "def _quantized_layer_prefix_candidates",
                    MOE_LAYER: "expert_data, loaded_weight = narrow_padded_param_and_loaded_weight(",
                    LOADER: '+ ["model.decoder.*", "stages.*"]'},
    },
}
