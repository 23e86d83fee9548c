"""A tiny checkpoint under RedHatAI/DeepSeek-V4-Flash-NVFP4-FP8's real quantization_config (tests/data/real/).

The config is the published one with tiny dimensions and its nulls kept. Tensor names are the layer names the config's
targets select as vLLM 0.32's DeepSeek-V4 names them (models/deepseek_v4: `layers.N.attn.fused_wqa_wkv`, `wq_b`,
`wo_a`, `wo_b`; `layers.N.ffn.shared_experts.gate_up_proj` / `down_proj`): the published index was not found
(PROVENANCE.md), so these are the names the targets are written for, not a copy of the release's. Attention
projections are stored FP8 block 128x128 (float8_e4m3fn weight, float32 `weight_scale` per block, as
compressed-tensors' float-quantized block strategy writes them), FFN projections NVFP4 (compressed-tensors leaves,
repair.codec quantizing as ModelOpt does), the router and head BF16.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.codec import nvfp4

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real" / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json"
TINY = {"num_hidden_layers": 2, "compress_ratios": [0, 4], "hidden_size": 256, "moe_intermediate_size": 64,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "num_attention_heads": 4, "head_dim": 128, "q_lora_rank": 128,
        "o_lora_rank": 128, "o_groups": 2, "vocab_size": 512, "num_hash_layers": 1}
BLOCK = 128


def _fp8_block(name: str, out: int, inn: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    weight = torch.randn(out, inn, generator=gen) * 100
    return {f"{name}.weight": weight.clamp(-448, 448).to(torch.float8_e4m3fn),
            f"{name}.weight_scale": torch.rand(-(-out // BLOCK), -(-inn // BLOCK), generator=gen) / 100 + 1e-4}


def _nvfp4(name: str, out: int, inn: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    packed, scale, scale_2 = nvfp4.quantize(torch.randn(out, inn, generator=gen).to(torch.bfloat16))
    return {f"{name}.weight_packed": packed, f"{name}.weight_scale": scale, f"{name}.weight_global_scale": 1.0 / scale_2,
            f"{name}.input_global_scale": torch.tensor(100.0)}


def tensors(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, rank = config["hidden_size"], config["moe_intermediate_size"], config["q_lora_rank"]
    heads, head_dim = config["num_attention_heads"], config["head_dim"]
    out: dict[str, torch.Tensor] = {"embed.weight": torch.randn(config["vocab_size"], hidden, generator=gen).to(torch.bfloat16),
                                    "head.weight": torch.randn(config["vocab_size"], hidden, generator=gen).to(torch.bfloat16)}
    for i in range(config["num_hidden_layers"]):
        attn, ffn = f"layers.{i}.attn", f"layers.{i}.ffn"
        out |= _fp8_block(f"{attn}.fused_wqa_wkv", rank + head_dim, hidden, gen)
        out |= _fp8_block(f"{attn}.wq_b", heads * head_dim, rank, gen)
        out |= _fp8_block(f"{attn}.wo_a", config["o_groups"] * config["o_lora_rank"], heads * head_dim // config["o_groups"], gen)
        out |= _fp8_block(f"{attn}.wo_b", hidden, config["o_groups"] * config["o_lora_rank"], gen)
        out |= _nvfp4(f"{ffn}.shared_experts.gate_up_proj", 2 * inter, hidden, gen)
        out |= _nvfp4(f"{ffn}.shared_experts.down_proj", hidden, inter, gen)
        out[f"{ffn}.gate.weight"] = torch.randn(config["n_routed_experts"], hidden, generator=gen).to(torch.bfloat16)
    return out


def write(folder: Path, seed: int = 0) -> Path:
    """The tiny checkpoint in `folder` (created): config.json and model.safetensors."""
    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(REAL.read_text()) | TINY
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file(tensors(config, seed), str(folder / "model.safetensors"))
    return folder
