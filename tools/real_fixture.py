"""Tiny checkpoints with a published checkpoint's real tensor names, shard assignment and quantization
config (tests/data/real/): the names and layout are the world's, only the sizes are ours.

NVFP4 weights are packed with the project's codec (bitwise ModelOpt's, tests/test_codec_nvfp4.py).
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.codec import nvfp4

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real"
HIDDEN, INTER, KV, VOCAB = 64, 128, 32, 256
PROJ_SHAPES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (KV, HIDDEN), "v_proj": (KV, HIDDEN), "o_proj": (HIDDEN, HIDDEN),
               "gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN), "down_proj": (HIDDEN, INTER)}
_PROJ_LEAF = re.compile(r"(.*\.(\w+_proj))\.(weight|weight_scale|weight_scale_2|input_scale|k_scale|v_scale)$")


def real_weight_map(name: str) -> dict[str, str]:
    return json.loads((REAL / name / "model.safetensors.index.json").read_text())["weight_map"]


def llama_tensors(names: list[str], seed: int = 0) -> dict[str, torch.Tensor]:
    """A value for every name of a Llama-style NVFP4 export: packed projections, scalar scales, BF16 rest."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    inputs: dict[str, float] = {}  # fused siblings (q/k/v, gate/up) share one input_scale, as _nvfp4_leaves says
    for name in names:
        match = _PROJ_LEAF.match(name)
        if match and match[3] == "input_scale":
            drawn = 0.01 + torch.rand((), generator=gen).item()  # each draws (the other values stay as they were)
            out[name] = torch.tensor(inputs.setdefault(input_group(match[1]), drawn))
        elif match and match[3] == "weight":
            weight = (torch.randn(PROJ_SHAPES[match[2]], generator=gen) * 0.05).to(torch.bfloat16)
            packed, scale, scale_2 = nvfp4.quantize(weight)
            out.update({f"{match[1]}.weight": packed, f"{match[1]}.weight_scale": scale, f"{match[1]}.weight_scale_2": scale_2})
        elif match and match[3] in ("input_scale", "k_scale", "v_scale"):
            out[name] = torch.tensor(0.01 + torch.rand((), generator=gen).item())
        elif name.endswith("norm.weight"):
            out[name] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        elif not match:
            out[name] = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05).to(torch.bfloat16)
    if set(out) != set(names):
        raise ValueError(f"names this builder does not know: {sorted(set(names) ^ set(out))[:5]}")
    return out


def write_llama(folder: Path, real: str, weight_map: dict[str, str]) -> Path:
    """`real`'s quantization config and tensor names, written into the shards `weight_map` assigns, in its order."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tensors = llama_tensors(list(weight_map))
    for shard in sorted(set(weight_map.values())):
        save_file({n: tensors[n].contiguous() for n in weight_map if weight_map[n] == shard}, folder / shard, metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.copy(REAL / real / "hf_quant_config.json", folder)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
              "num_hidden_layers": 1 + max(int(m[1]) for n in weight_map if (m := re.match(r"model\.layers\.(\d+)\.", n))),
              "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


# --------------------------------------------------------------------------------------------------------
# Tiny checkpoints of whole published NVFP4 models: real quantization config (verbatim, tests/data/real),
# real architecture and tensor-name patterns (transformers' own model class, built on the meta device,
# gives the names), tiny sizes. Modules are stored NVFP4 or BF16 as the published checkpoint stores them
# (`bf16`: what its config declares unquantized), so each fixture is a healthy checkpoint.
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RealModel:
    """One published checkpoint, shrunk: `config` is the transformers config (tiny sizes), `real` the
    tests/data/real folder its quantization config comes from."""

    real: str
    fmt: str  # "modelopt" (hf_quant_config.json) | "compressed-tensors" (config.json quantization_config)
    architecture: str
    config: dict
    bf16: str  # regex (re.search) over module names the published checkpoint stores BF16
    renames: tuple[tuple[str, str], ...] = ()  # regex substitutions from transformers' names to the published ones
    kv_fp8: bool = False  # ModelOpt FP8 KV cache: k_proj.k_scale / v_proj.v_scale on text attention
    extra: str | None = None  # name of a function adding names transformers does not build (DeepSeek's MTP layer)


_LLAMA = dict(hidden_size=HIDDEN, intermediate_size=INTER, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
              vocab_size=VOCAB, num_hidden_layers=2, rms_norm_eps=1e-5, tie_word_embeddings=False)
_DEEPSEEK = dict(hidden_size=HIDDEN, intermediate_size=INTER, moe_intermediate_size=32, n_routed_experts=2, n_shared_experts=1,
                 num_experts_per_tok=1, n_group=1, topk_group=1, topk_method="noaux_tc", first_k_dense_replace=3,
                 # 61 decoder layers as published, so that the real exclusions (exact names of layers 0-60 and the
                 # MTP wildcard `model.layers.61*`) keep naming the same layers; the MTP layer is model.layers.61
                 num_hidden_layers=61, num_nextn_predict_layers=1, num_attention_heads=2, num_key_value_heads=2,
                 q_lora_rank=32, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16, vocab_size=VOCAB,
                 tie_word_embeddings=False)

REAL_MODELS: dict[str, RealModel] = {
    # ModelOpt 0.23.0, only hf_quant_config.json; excludes lm_head only
    "llama-3.3-70b": RealModel("llama-3.3-70b-instruct-fp4", "modelopt", "LlamaForCausalLM", _LLAMA,
                               bf16=r"^lm_head$", kv_fp8=True),
    # ModelOpt 0.33.0 dense Qwen3 (q_norm/k_norm; vLLM fuses q/k/v and gate/up); lm_head excluded
    "qwen3-32b": RealModel("qwen3-32b-nvfp4", "modelopt", "Qwen3ForCausalLM", _LLAMA, bf16=r"^lm_head$", kv_fp8=True),
    # ModelOpt 0.33.0 MoE: per-expert experts.N.*_proj; every router mlp.gate and lm_head excluded by name
    "qwen3-30b-a3b": RealModel("qwen3-30b-a3b-nvfp4", "modelopt", "Qwen3MoeForCausalLM",
                               # 48 decoder layers as published, so that its exclusions (every layer's router
                               # by exact name) keep naming modules that exist
                               dict(_LLAMA, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                    decoder_sparse_step=1, mlp_only_layers=[], num_hidden_layers=48),
                               bf16=r"\.mlp\.gate$|^lm_head$", kv_fp8=True),
    # ModelOpt 0.27.0: attention by `model.layers.N.self_attn*`, routers, the MTP layer by `model.layers.61*`
    "deepseek-v3-0324": RealModel("deepseek-v3-0324-nvfp4", "modelopt", "DeepseekV3ForCausalLM", _DEEPSEEK,
                                  bf16=r"\.self_attn\.|\.mlp\.gate$|^model\.layers\.61\.|^lm_head$", extra="deepseek_mtp"),
    # ModelOpt 0.23.0: attention by exact names (not q_a_proj, not o_proj), routers, MTP by `model.layers.61*`
    "deepseek-r1": RealModel("deepseek-r1-fp4", "modelopt", "DeepseekV3ForCausalLM", _DEEPSEEK,
                             bf16=r"\.(kv_a_proj_with_mqa|q_b_proj|kv_b_proj)$|\.mlp\.gate$|^model\.layers\.61\.|^lm_head$",
                             extra="deepseek_mtp"),
    # ModelOpt 0.37.0 multimodal: model.language_model.*, vision tower and embed_vision and all attention excluded
    "gemma-4-31b-it": RealModel(
        "gemma-4-31b-it-nvfp4", "modelopt", "Gemma4ForConditionalGeneration",
        dict(text_config=dict(hidden_size=HIDDEN, intermediate_size=INTER, num_hidden_layers=2, num_attention_heads=2,
                              num_key_value_heads=1, head_dim=32, global_head_dim=32, vocab_size=VOCAB,
                              layer_types=["sliding_attention", "full_attention"], hidden_size_per_layer_input=0,
                              sliding_window=16, enable_moe_block=False, num_kv_shared_layers=0),
             vision_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                head_dim=16, num_key_value_heads=2, patch_size=16, position_embedding_size=64),
             audio_config=None, tie_word_embeddings=True),
        bf16=r"\.self_attn\.|^model\.vision_tower\.|^model\.embed_vision\.|^lm_head$", kv_fp8=True),
    # compressed-tensors: Laguna-M.1's published quantization_config block (tests/data/real/laguna-m.1-nvfp4), on
    # its own architecture (MoE: per-expert experts.N.*_proj, shared_expert, router mlp.gate) ...
    "ct-laguna-moe": RealModel(
        "laguna-m.1-nvfp4", "compressed-tensors", "LagunaForCausalLM",
        dict(_LLAMA, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
             mlp_layer_types=["dense", "sparse"]),
        bf16=r"\.self_attn\.|\.mlp\.gate$|^lm_head$",
        # Laguna's published names (vLLM's laguna.py loader): shared_expert, the bias under mlp.experts
        renames=((r"\.mlp\.shared_experts\.", ".mlp.shared_expert."),
                 (r"\.mlp\.gate\.e_score_correction_bias$", ".mlp.experts.e_score_correction_bias"))),
    # ... and on a dense Llama (no dense compressed-tensors NVFP4 config.json was found, PROVENANCE.md): the same
    # block's `re:` targets and ignore entries name the same self_attn.*_proj / mlp.*_proj modules
    "ct-llama-dense": RealModel("laguna-m.1-nvfp4", "compressed-tensors", "LlamaForCausalLM", _LLAMA,
                                bf16=r"\.self_attn\.|^lm_head$"),
}
_NOT_LINEAR = re.compile(r"embed_tokens$|norm$|position_embedding|^model\.layers\.61\.(enorm|hnorm)$")
_SIBLINGS = re.compile(r"^(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)$")


def input_group(module: str) -> str:
    """The group of linears reading one input tensor that `module` is in: fused siblings (q/k/v, gate/up) share one."""
    sib = _SIBLINGS.match(module)
    return f"{sib[1]}.{'qkv' if sib[2] in ('q_proj', 'k_proj', 'v_proj') else 'gate_up'}" if sib else module


def transformers_names(model: RealModel) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of transformers' own model class for `model.config`, in checkpoint layout:
    fused expert tensors split per expert (experts.N.{gate,up,down}_proj, as published), tied lm_head dropped."""
    import transformers

    cls = getattr(transformers, model.architecture)
    config = cls.config_class(**model.config)
    with torch.device("meta"):
        state = cls(config).state_dict()
    out: dict[str, tuple[int, ...]] = {}
    for name, t in state.items():
        if name == "lm_head.weight" and model.config.get("tie_word_embeddings"):
            continue
        if name.endswith(".experts.gate_up_proj"):
            half = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{name[:-len('gate_up_proj')]}{e}.gate_proj.weight"] = (half, t.shape[2])
                out[f"{name[:-len('gate_up_proj')]}{e}.up_proj.weight"] = (half, t.shape[2])
        elif name.endswith(".experts.down_proj"):
            for e in range(t.shape[0]):
                out[f"{name[:-len('down_proj')]}{e}.down_proj.weight"] = tuple(t.shape[1:])
        else:
            for pattern, new in model.renames:
                name = re.sub(pattern, new, name)
            out[name] = tuple(t.shape)
    return out


def deepseek_mtp(names: dict[str, tuple[int, ...]], config: dict) -> dict[str, tuple[int, ...]]:
    """DeepSeek-V3/R1's MTP layer as published: model.layers.61 = a MoE decoder layer plus enorm, hnorm, eh_proj,
    shared_head.{norm,head} and its own embed_tokens (transformers does not build it)."""
    last, mtp = config["num_hidden_layers"] - 1, config["num_hidden_layers"]
    out = dict(names)
    for name, shape in names.items():
        if name.startswith(f"model.layers.{last}."):
            out[name.replace(f"model.layers.{last}.", f"model.layers.{mtp}.", 1)] = shape
    h, v = config["hidden_size"], config["vocab_size"]
    out.update({f"model.layers.{mtp}.enorm.weight": (h,), f"model.layers.{mtp}.hnorm.weight": (h,),
                f"model.layers.{mtp}.eh_proj.weight": (h, 2 * h), f"model.layers.{mtp}.shared_head.norm.weight": (h,),
                f"model.layers.{mtp}.shared_head.head.weight": (v, h), f"model.layers.{mtp}.embed_tokens.weight": (v, h)})
    return out


def checkpoint_tensors(model: RealModel, names: dict[str, tuple[int, ...]], seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: NVFP4 leaves (ModelOpt or compressed-tensors names) for the linears the
    config quantizes, one weight_scale_2 shared by fused siblings (q/k/v, gate/up) as ModelOpt exports them."""
    gen = torch.Generator().manual_seed(seed)
    weights = {n: (torch.randn(s, generator=gen) * 0.05).to(torch.bfloat16) for n, s in names.items() if len(s) == 2}
    out: dict[str, torch.Tensor] = {}
    inputs: dict[str, float] = {}  # a sibling group's one activation scale
    for name, shape in names.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and len(shape) == 2 and not _NOT_LINEAR.search(module) and not re.search(model.bf16, module):
            out.update(_nvfp4_leaves(model, module, weights, gen, inputs))
        elif len(shape) == 2:
            out[name] = weights[name]
        elif name.endswith("e_score_correction_bias"):
            out[name] = torch.zeros(shape, dtype=torch.float32)
        else:
            out[name] = torch.ones(shape, dtype=torch.bfloat16)
    return out


def _nvfp4_leaves(model: RealModel, module: str, weights: dict, gen: torch.Generator,
                  inputs: dict[str, float]) -> dict[str, torch.Tensor]:
    """One module's NVFP4 tensors. Fused siblings (q/k/v, gate/up: one input tensor) share weight_scale_2 and the
    activation scale: ModelOpt 0.47 unifies both over modules that share an input (unified_export_hf.py
    `_fuse_shared_input_modules` -> quant_utils.py `preprocess_linear_fusion`: input_quantizer.amax = the group's
    max), and any calibrator observes one input tensor alike (llm-compressor's input_global_scale)."""
    sib = _SIBLINGS.match(module)
    group = [f"{sib[1]}.{p}.weight" for p in (("q_proj", "k_proj", "v_proj") if sib[2] in ("q_proj", "k_proj", "v_proj")
                                             else ("gate_proj", "up_proj"))] if sib else [f"{module}.weight"]
    scale_2 = max(nvfp4.global_scale(weights[n]) for n in group if n in weights)
    packed, scale, scale_2 = nvfp4.quantize(weights[f"{module}.weight"], scale_2)
    drawn = 0.01 + torch.rand((), generator=gen).item()  # each draws (the other values stay as they were)
    input_scale = torch.tensor(inputs.setdefault(input_group(module), drawn))  # the first sibling's, in name order
    if model.fmt == "compressed-tensors":
        return {f"{module}.weight_packed": packed, f"{module}.weight_scale": scale,
                f"{module}.weight_global_scale": 1.0 / scale_2, f"{module}.input_global_scale": 1.0 / input_scale}
    out = {f"{module}.weight": packed, f"{module}.weight_scale": scale, f"{module}.weight_scale_2": scale_2,
           f"{module}.input_scale": input_scale}
    if model.kv_fp8 and re.search(r"\.self_attn\.[kv]_proj$", module) and "vision" not in module:
        out[f"{module}.{module[-6]}_scale"] = torch.tensor(0.01 + torch.rand((), generator=gen).item())
    return out


def write_real_model(folder: Path, key: str, model: RealModel | None = None) -> Path:
    """REAL_MODELS[key] as a one-file checkpoint in `folder` (replaced): model.safetensors, config.json with
    the real architecture (and, for compressed-tensors, the real quantization_config), hf_quant_config.json.
    `model`: a variant of it (another `bf16` storage pattern, say) written instead."""
    model = model or REAL_MODELS[key]
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    names = transformers_names(model)
    if model.extra:
        names = globals()[model.extra](names, model.config)
    tensors = checkpoint_tensors(model, names)
    save_file({n: t.contiguous() for n, t in sorted(tensors.items())}, folder / "model.safetensors", metadata={"format": "pt"})
    import transformers

    config = getattr(transformers, model.architecture).config_class(**model.config).to_dict()
    config.update(architectures=[model.architecture], torch_dtype="bfloat16")
    config.pop("transformers_version", None)
    if model.fmt == "compressed-tensors":
        config["quantization_config"] = json.loads((REAL / model.real / "quantization_config.json").read_text())
    else:
        shutil.copy(REAL / model.real / "hf_quant_config.json", folder)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


# --------------------------------------------------------------------------------------------------------
# nvidia/Qwen3.6-35B-A3B-NVFP4: a ModelOpt MIXED_PRECISION MoE with an MTP block (issue 19). Its config files
# were NOT found verbatim (tests/data/evidence/PROVENANCE.md): the per-layer algorithms are
# reconstructed from the published facts stored there, and the two config files are then written by ModelOpt
# 0.47's own code from that map (quant_utils.process_layer_quant_config, the MTP exclusions of
# unified_export_hf._add_mtp_exclusions, convert_hf_config.convert_hf_quant_config_format), never by hand.
# --------------------------------------------------------------------------------------------------------
QWEN36 = RealModel(  # `real` names its folder under tests/data/evidence, not tests/data/real (no verbatim config)
    "qwen3.6-35b-a3b-nvfp4", "modelopt-mixed", "Qwen3_5MoeForConditionalGeneration",
    # 40 decoder layers as published (3 linear-attention : 1 full-attention), tiny widths, 4 experts
    dict(text_config=dict(hidden_size=HIDDEN, num_hidden_layers=40, num_attention_heads=2, num_key_value_heads=1,
                          head_dim=32, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=4,
                          num_experts_per_tok=2, vocab_size=VOCAB, linear_num_key_heads=2, linear_num_value_heads=2,
                          linear_key_head_dim=16, linear_value_head_dim=16, full_attention_interval=4,
                          mtp_num_hidden_layers=1),
         vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=HIDDEN, patch_size=16),
         tie_word_embeddings=False),
    bf16=r"^model\.visual\.|\.mlp\.gate$|\.shared_expert_gate$|\.linear_attn\.in_proj_[ab]$|^mtp\.", kv_fp8=True,
    extra="qwen36_mtp")
QWEN36_PRODUCER = {"name": "modelopt", "version": "0.44.0"}  # the published producer (PROVENANCE.md)
QWEN36_MTP_PREFIXES = ("mtp", "mtp.layers.0")  # what ModelOpt records as the model's MTP layers -> "mtp*", "mtp.layers.0*"


def qwen36_algorithm(module: str) -> str | None:
    """The published per-layer algorithm of a (checkpoint-named) linear: routed and shared experts and lm_head
    W4A16_NVFP4, linear-attention and full-attention projections FP8, everything else unquantized."""
    if re.search(QWEN36.bf16, module) or _NOT_LINEAR.search(module) or "conv1d" in module:
        return None
    if re.search(r"\.mlp\.(experts\.\d+|shared_expert)\.(gate|up|down)_proj$|^lm_head$", module):
        return "W4A16_NVFP4"
    if re.search(r"\.(linear_attn\.(in_proj_qkv|in_proj_z|out_proj)|self_attn\.[qkvo]_proj)$", module):
        return "FP8"
    return None


def qwen36_mtp(names: dict[str, tuple[int, ...]], config: dict) -> dict[str, tuple[int, ...]]:
    """The MTP block as vLLM's qwen3_5_mtp.py loads it (transformers does not build it): mtp.fc [h, 2h], mtp.norm,
    mtp.pre_fc_norm_{hidden,embedding} and mtp.layers.0, a full-attention MoE decoder layer (as the last one)."""
    text = config["text_config"]
    last = f"model.language_model.layers.{text['num_hidden_layers'] - 1}."
    out = dict(names)
    out.update({n.replace(last, "mtp.layers.0.", 1): s for n, s in names.items() if n.startswith(last)})
    h = text["hidden_size"]
    out.update({"mtp.fc.weight": (h, 2 * h), "mtp.norm.weight": (h,), "mtp.pre_fc_norm_hidden.weight": (h,),
                "mtp.pre_fc_norm_embedding.weight": (h,)})
    return out


def qwen36_quant_configs(layers: dict[str, str]) -> tuple[dict, dict]:
    """(hf_quant_config.json, config.json quantization_config) as ModelOpt's export writes them for `layers`
    (checkpoint module -> algorithm). Fused experts are one ModelOpt module, `...mlp.experts`, as published."""
    from tools.modelopt_export import _modelopt

    _modelopt()  # the import, with its known noise silenced
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format
    from modelopt.torch.export.quant_utils import process_layer_quant_config

    fmt = {"W4A16_NVFP4": "w4a16_nvfp4", "FP8": "fp8"}
    per_module: dict[str, str] = {}
    for name, algo in layers.items():
        per_module[re.sub(r"\.experts\.\d+\.(gate|up|down)_proj$", ".experts", name)] = fmt[algo]
    layer_config = {}
    for name, f in per_module.items():
        layer_config[f"{name}.quantization"] = f
        layer_config[f"{name}.awq_block_size"] = 16 if f == "w4a16_nvfp4" else 0
    quantization = {"quant_algo": None, "kv_cache_quant_algo": None, **process_layer_quant_config(layer_config)}
    quantization["kv_cache_quant_algo"] = "FP8"
    quantization.setdefault("exclude_modules", []).extend(f"{p}*" for p in QWEN36_MTP_PREFIXES)
    hf = {"producer": dict(QWEN36_PRODUCER), "quantization": quantization}
    return hf, convert_hf_quant_config_format(hf)


def qwen36_tensors(names: dict[str, tuple[int, ...]], seed: int = 0, published_input_scales: bool = False
                  ) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor, stored as ModelOpt 0.47 writes each algorithm (FP8 per-tensor: fp8 weight, weight_scale,
    input_scale; W4A16_NVFP4: packed weight, block scales, weight_scale_2; fused siblings share one scale), plus the
    FP8 KV-cache scales of the full-attention layers; and the module -> algorithm map. published_input_scales: the
    W4A16_NVFP4 linears (not the routed experts) also get an input_scale, as the published checkpoint's do."""
    from repair.codec import fp8

    gen = torch.Generator().manual_seed(seed)
    weights = {n: (torch.randn(s, generator=gen) * 0.05).to(torch.bfloat16) for n, s in names.items() if len(s) == 2}
    layers = {n.removesuffix(".weight"): a for n in weights if (a := qwen36_algorithm(n.removesuffix(".weight")))}
    out: dict[str, torch.Tensor] = {}
    for name, shape in names.items():
        module = name.removesuffix(".weight")
        algo = layers.get(module) if name.endswith(".weight") else None
        if algo is None:  # BF16 linears, conv1d [c, 1, k] and patch_embed kernels, norms and the GDN's A_log / dt_bias
            out[name] = weights[name] if len(shape) == 2 else (torch.randn(shape, generator=gen) * 0.05).to(torch.bfloat16) \
                if len(shape) > 2 else torch.ones(shape, dtype=torch.bfloat16)
            continue
        sib = _SIBLINGS.match(module)
        group = [f"{sib[1]}.{p}.weight" for p in (("q_proj", "k_proj", "v_proj") if sib[2] in ("q_proj", "k_proj", "v_proj")
                                                 else ("gate_proj", "up_proj"))] if sib else [name]
        if algo == "FP8":
            w, s = fp8.quantize(weights[name], max(fp8.weight_scale(weights[n]) for n in group if n in weights))
            out.update({name: w, f"{module}.weight_scale": s, f"{module}.input_scale": torch.tensor(0.01 + torch.rand((), generator=gen).item())})
            if module.endswith(("self_attn.k_proj", "self_attn.v_proj")):
                out[f"{module}.{module[-6]}_scale"] = torch.tensor(0.01 + torch.rand((), generator=gen).item())
        else:
            packed, scale, scale_2 = nvfp4.quantize(weights[name], max(nvfp4.global_scale(weights[n]) for n in group if n in weights))
            out.update({name: packed, f"{module}.weight_scale": scale, f"{module}.weight_scale_2": scale_2.reshape(())})
            if published_input_scales and ".experts." not in module:
                out[f"{module}.input_scale"] = torch.tensor(0.01 + torch.rand((), generator=gen).item())
    return out, layers


def write_qwen36(folder: Path, seed: int = 0, published_input_scales: bool = False) -> Path:
    """The Qwen3.6-35B-A3B-NVFP4 layout as a one-file checkpoint in `folder` (replaced): model.safetensors,
    config.json (transformers' own config for QWEN36.config, with ModelOpt's quantization_config), hf_quant_config.json."""
    import transformers

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    names = qwen36_mtp(transformers_names(QWEN36), QWEN36.config)
    tensors, layers = qwen36_tensors(names, seed, published_input_scales)
    save_file({n: t.contiguous() for n, t in sorted(tensors.items())}, folder / "model.safetensors", metadata={"format": "pt"})
    hf, quantization_config = qwen36_quant_configs(layers)
    (folder / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    config = getattr(transformers, QWEN36.architecture).config_class(**QWEN36.config).to_dict()
    config.update(architectures=[QWEN36.architecture], torch_dtype="bfloat16", quantization_config=quantization_config)
    config.pop("transformers_version", None)
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    return folder

