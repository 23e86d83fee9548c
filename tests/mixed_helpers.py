"""Small ModelOpt MIXED_PRECISION checkpoints built in code: real tensor layouts (bytes from repair.codec,
byte-identical to ModelOpt's quantizers) and config files shaped as ModelOpt 0.47's export writes them
(modelopt/torch/export/convert_hf_config.py convert_hf_quant_config_format, quant_utils.get_quant_config).

The healthy model: a 2-layer Llama; attention FP8 (per-tensor), MLP NVFP4, layer 1's down_proj
NVFP4_AWQ (with pre_quant_scale) and its gate/up W4A16_NVFP4, lm_head excluded (stored BF16, not in
quantized_layers), FP8 KV cache (k_proj.k_scale, v_proj.v_scale present and declared).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.codec import fp8, nvfp4

HIDDEN, INTER, HEAD_DIM, VOCAB = 64, 128, 16, 96
ATTN = {"q_proj": (64, HIDDEN), "k_proj": (32, HIDDEN), "v_proj": (32, HIDDEN), "o_proj": (HIDDEN, 64)}
MLP = {"gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN), "down_proj": (HIDDEN, INTER)}


def healthy_layers() -> dict[str, str]:
    """quantized_layers of the healthy model: layer name -> algorithm."""
    out = {}
    for i in range(2):
        for proj in ATTN:
            out[f"model.layers.{i}.self_attn.{proj}"] = "FP8"
        for proj in MLP:
            out[f"model.layers.{i}.mlp.{proj}"] = "NVFP4"
    out["model.layers.1.mlp.gate_proj"] = out["model.layers.1.mlp.up_proj"] = "W4A16_NVFP4"
    out["model.layers.1.mlp.down_proj"] = "NVFP4_AWQ"
    return out


def entry(algo: str) -> dict:
    return {"quant_algo": algo, "group_size": 16} if "NVFP4" in algo else {"quant_algo": algo}


SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # ModelOpt exports them with one shared scale


def quantized_tensors(name: str, weight: torch.Tensor, algo: str, shared: torch.Tensor | None, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One layer's tensors as ModelOpt stores them for `algo` (`shared`: the siblings' common weight scale)."""
    if algo == "FP8":
        w, s = fp8.quantize(weight, shared)
        return {f"{name}.weight": w, f"{name}.weight_scale": s, f"{name}.input_scale": torch.tensor(0.02)}
    packed, block, scale_2 = nvfp4.quantize(weight, shared)
    out = {f"{name}.weight": packed, f"{name}.weight_scale": block, f"{name}.weight_scale_2": scale_2.reshape(())}
    if algo in ("NVFP4", "NVFP4_AWQ"):
        out[f"{name}.input_scale"] = torch.tensor(0.01)
    if algo == "NVFP4_AWQ":
        out[f"{name}.pre_quant_scale"] = (torch.rand(weight.shape[1], generator=gen) + 0.5).to(torch.bfloat16)
    return out


def _shared_scale(weights: dict[str, torch.Tensor], layers: dict[str, str], name: str) -> torch.Tensor | None:
    """The scale ModelOpt gives fused siblings stored in one algorithm: the largest of theirs."""
    parent, _, proj = name.rpartition(".")
    group = next((g for g in SIBLINGS if proj in g), ())
    members = [f"{parent}.{p}" for p in group if layers.get(f"{parent}.{p}") == layers[name]]
    if len(members) < 2:
        return None
    scale = fp8.weight_scale if layers[name] == "FP8" else nvfp4.global_scale
    return torch.stack([scale(weights[m]) for m in members]).amax()


def tensors_for(layers: dict[str, str], kv: bool = True, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the 2-layer model: `layers` (name -> algorithm) quantized, the rest BF16."""
    gen = torch.Generator().manual_seed(seed)
    out = {"model.embed_tokens.weight": torch.randn(VOCAB, HIDDEN, generator=gen).to(torch.bfloat16),
           "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
           "lm_head.weight": torch.randn(VOCAB, HIDDEN, generator=gen).to(torch.bfloat16)}
    weights = {f"model.layers.{i}.{part}.{proj}": torch.randn(shape, generator=gen).to(torch.bfloat16)
               for i in range(2) for part, projs in (("self_attn", ATTN), ("mlp", MLP)) for proj, shape in projs.items()}
    for name, weight in weights.items():
        if name in layers:
            out.update(quantized_tensors(name, weight, layers[name], _shared_scale(weights, layers, name), gen))
        else:
            out[f"{name}.weight"] = weight
    for i in range(2):
        out[f"model.layers.{i}.input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        out[f"model.layers.{i}.post_attention_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        if kv:
            out[f"model.layers.{i}.self_attn.k_proj.k_scale"] = torch.tensor(0.05)
            out[f"model.layers.{i}.self_attn.v_proj.v_scale"] = torch.tensor(0.04)
    return out


def hf_quant_config(layers: dict[str, str], kv: bool = True, exclude: list[str] | None = None) -> dict:
    """hf_quant_config.json as ModelOpt's get_quant_config writes it for MIXED_PRECISION."""
    quantization = {"quant_algo": "MIXED_PRECISION", "kv_cache_quant_algo": "FP8" if kv else None,
                    "quantized_layers": {name: entry(algo) for name, algo in layers.items()}}
    if exclude is not None:
        quantization["exclude_modules"] = exclude
    return {"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": quantization}


def quantization_config(hf: dict) -> dict:
    """config.json quantization_config: ModelOpt's own convert_hf_quant_config_format of hf_quant_config.json."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    return convert_hf_quant_config_format(hf)


def llama_config() -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": HEAD_DIM, "num_hidden_layers": 2,
            "vocab_size": VOCAB, "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}


def write_mixed(folder: Path, layers: dict[str, str] | None = None, *, kv: bool = True, kv_scales: bool | None = None,
                exclude: list[str] | None = None, tensors: dict[str, torch.Tensor] | None = None,
                config_json: bool = True) -> Path:
    """Write a MIXED_PRECISION checkpoint to `folder` (both config files, one shard)."""
    layers = healthy_layers() if layers is None else layers
    folder.mkdir(parents=True, exist_ok=True)
    hf = hf_quant_config(layers, kv, exclude)
    config = llama_config()
    if config_json:
        config["quantization_config"] = quantization_config(hf)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    stored = tensors if tensors is not None else tensors_for(layers, kv if kv_scales is None else kv_scales)
    save_file({k: v.contiguous() for k, v in stored.items()}, str(folder / "model.safetensors"))
    return folder


def groups_by_algo(quant_cfg: dict) -> dict[str, list[str]]:
    """config_groups as {algorithm: targets}, read back through quantized_layers."""
    layers = quant_cfg["quantized_layers"]
    out: dict[str, list[str]] = defaultdict(list)
    for group in quant_cfg["config_groups"].values():
        for target in group["targets"]:
            out[layers[target]["quant_algo"]].append(target)
    return dict(out)


def write_single_nested(folder: Path, algo: str) -> Path:
    """The healthy model's layers all `algo` (NVFP4_AWQ: NVFP4 plus pre_quant_scale), declared as ModelOpt's single
    quant_algo in hf_quant_config.json only (config.json without quantization_config)."""
    layers = {name: algo for name in healthy_layers()}
    write_mixed(folder, layers, config_json=False, kv=False)
    hf = json.loads((folder / "hf_quant_config.json").read_text())
    quantization = hf["quantization"]
    del quantization["quantized_layers"]
    quantization |= {"quant_algo": algo, "group_size": 16, "exclude_modules": ["lm_head"]}
    (folder / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    return folder
