"""A header-only checkpoint with the tensor count and sharding of DeepSeek-R1 NVFP4 (~180k tensors).

What costs time per tensor (parsing headers, grouping modules, sorting, planning) is what this
measures, so the files hold real headers, real scale bytes (fp8 block scales of 1.0, positive
float32 global and input scales: what doctor reads) and packed weights left as holes: each shard
is extended with truncate, so its packed bytes are zeros that take no disk. Expert shapes are
scaled down ([EXPERT_OUT, EXPERT_IN] logical) so doctor's block-scale reads stay small; at
DeepSeek's real shapes they alone are ~40 GB (see BENCHMARKS.md).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

HIDDEN, EXPERT_OUT, EXPERT_IN = 256, 64, 256
FP8_ONE = b"\x38"  # float8_e4m3fn 1.0
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
ATTENTION = ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def _packed(prefix: str, out: int, inp: int) -> list[tuple[str, str, list[int]]]:
    """One NVFP4 Linear as ModelOpt stores it: four tensors."""
    return [(f"{prefix}.weight", "U8", [out, inp // 2]), (f"{prefix}.weight_scale", "F8_E4M3", [out, inp // 16]),
            (f"{prefix}.weight_scale_2", "F32", []), (f"{prefix}.input_scale", "F32", [])]


def tensors(layers: int, experts: int, dense_layers: int = 3) -> list[tuple[str, str, list[int]]]:
    """Every tensor (name, dtype, shape) in DeepSeek-V3's order: dense layers first, then MoE layers."""
    out = [("model.embed_tokens.weight", "BF16", [1024, HIDDEN])]
    for layer in range(dense_layers + layers):
        p = f"model.layers.{layer}"
        out += [(f"{p}.input_layernorm.weight", "BF16", [HIDDEN]), (f"{p}.post_attention_layernorm.weight", "BF16", [HIDDEN])]
        out += [(f"{p}.self_attn.{a}.weight", "BF16", [HIDDEN, HIDDEN]) for a in ATTENTION]
        if layer < dense_layers:
            out += [t for proj in PROJECTIONS for t in _packed(f"{p}.mlp.{proj}", EXPERT_OUT, EXPERT_IN)]
            continue
        out += [(f"{p}.mlp.gate.weight", "BF16", [experts, HIDDEN]), (f"{p}.mlp.gate.e_score_correction_bias", "F32", [experts])]
        out += [t for proj in PROJECTIONS for t in _packed(f"{p}.mlp.shared_experts.{proj}", EXPERT_OUT, EXPERT_IN)]
        out += [t for e in range(experts) for proj in PROJECTIONS for t in _packed(f"{p}.mlp.experts.{e}.{proj}", EXPERT_OUT, EXPERT_IN)]
    return out + [("model.norm.weight", "BF16", [HIDDEN]), ("lm_head.weight", "BF16", [1024, HIDDEN])]


def write(folder: Path, layers: int = 58, experts: int = 256, shards: int = 163) -> Path:
    """Write the checkpoint (config files, index, `shards` safetensors files); returns `folder`."""
    from repair.io.dtypes import nbytes

    folder.mkdir(parents=True, exist_ok=False)
    names = tensors(layers, experts)
    per_shard = -(-len(names) // shards)
    weight_map = {}
    for i in range(shards):
        part = names[i * per_shard:(i + 1) * per_shard]
        shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        _write_shard(folder / shard, part, nbytes)
        weight_map.update({name: shard for name, _, _ in part})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _write_configs(folder, layers)
    return folder


def _write_shard(path: Path, part: list[tuple[str, str, list[int]]], nbytes) -> None:
    header, offset, scales = {}, 0, []
    for name, dtype, shape in part:
        size = nbytes(dtype, tuple(shape))
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        if dtype in ("F8_E4M3", "F32") and name.rpartition(".")[2] != "e_score_correction_bias":
            scales.append((offset, FP8_ONE * size if dtype == "F8_E4M3" else struct.pack("<f", 0.01)))
        offset += size
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(start + offset)  # everything else is a hole: zeros that cost no disk
        for at, data in scales:
            os.pwrite(fh.fileno(), data, start + at)


def _write_configs(folder: Path, layers: int) -> None:
    producer = {"name": "modelopt", "version": "0.47.0"}
    exclude = ["lm_head", "*embed_tokens", "*self_attn*", "*mlp.gate"]
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": HIDDEN,
              "num_hidden_layers": layers + 3, "first_k_dense_replace": 3, "torch_dtype": "bfloat16",
              "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": exclude, "producer": producer}}
    hf = {"producer": producer, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": exclude}}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    (folder / "hf_quant_config.json").write_text(json.dumps(hf, indent=2))
