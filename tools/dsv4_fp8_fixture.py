"""A tiny nvidia/DeepSeek-V4-Flash-NVFP4 as published: config.json's `fp8` + `moe_quant_algo: NVFP4` form.

The config is the real one (tests/data/real/deepseek-v4-flash-nvfp4/config.json, aiconfigurator 90f7fc0f) with tiny
dimensions that keep every FP8 layer a whole number of 128-blocks where vLLM's merged layers ask it (fp8_utils.py
validate_fp8_block_shape) and `quantized_layers` cut to the tiny layers. Names are DeepSeek-V4's native ones, the
names vLLM 0.32's mapper is written for (models/deepseek_v4/nvidia/model.py:1712-1760; tests/vllm checks them against
vLLM's own published names). What is stored how (vllm-project/recipes PR #541: "attention, shared experts, router
head, and MTP stay FP8"; DeepseekV4FP8Config, quant_config.py:29-84):
  * linear layers vLLM builds with the quant config (attention wq_a/wkv/wq_b/wo_a/wo_b, the indexer's wq_b, the
    shared experts' w1/w2/w3): float8_e4m3fn weight and a ue8m0 `scale` per 128x128 block (float8_e8m0fnu, as the
    fp4-expert checkpoints store them: quant_config.py:80-84);
  * routed experts: ModelOpt NVFP4 (weight, weight_scale, weight_scale_2, input_scale), w1/w3 of an expert sharing
    one global scale as ModelOpt exports them;
  * layers built without a quant config (compressors, the indexer's weights_proj, the router gate), norms, the hc_*
    mixers, embed and head: BF16 / float32.
`mtp=True` adds the MTP block `mtp.0.*` as published (its own FP8 linears and NVFP4 experts).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.codec import nvfp4

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real" / "deepseek-v4-flash-nvfp4" / "config.json"
TINY = {"num_hidden_layers": 3, "compress_ratios": [0, 4, 128], "hidden_size": 128, "q_lora_rank": 128,
        "num_attention_heads": 4, "head_dim": 512, "o_groups": 2, "o_lora_rank": 128, "moe_intermediate_size": 128,
        "n_routed_experts": 4, "num_experts_per_tok": 2, "vocab_size": 256, "index_n_heads": 4, "index_head_dim": 128,
        "num_hash_layers": 1, "sliding_window": 64}
BLOCK = 128


def config(layers: int = 3) -> dict:
    """The real config.json with the tiny dimensions; quantized_layers cut to the layers stored."""
    out = json.loads(REAL.read_text()) | TINY
    quant = out["quantization_config"]
    quant["quantized_layers"] = {k: v for k, v in quant["quantized_layers"].items() if int(k.split(".")[1]) < layers}
    return out


def _bf16(shape: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)


def fp8_block(name: str, out: int, inn: int, gen: torch.Generator, scale_dtype=torch.float8_e8m0fnu,
              leaf: str = "scale") -> dict[str, torch.Tensor]:
    """float8_e4m3fn weight [out, in] and its per-128x128-block power-of-two scale [ceil(out/128), ceil(in/128)]."""
    weight = (torch.randn(out, inn, generator=gen) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    exponents = torch.randint(-12, -6, (-(-out // BLOCK), -(-inn // BLOCK)), generator=gen).float()
    return {f"{name}.weight": weight, f"{name}.{leaf}": torch.exp2(exponents).to(scale_dtype)}


def _nvfp4(modules: list[str], rows: list[int], inn: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """ModelOpt's NVFP4 leaves of `modules` quantized as one weight, so they share one global scale."""
    packed, scale, scale_2 = nvfp4.quantize(_bf16((sum(rows), inn), gen))
    out, row = {}, 0
    for module, n in zip(modules, rows):
        out |= {f"{module}.weight": packed[row:row + n].contiguous(), f"{module}.weight_scale": scale[row:row + n].contiguous(),
                f"{module}.weight_scale_2": scale_2.clone(), f"{module}.input_scale": torch.tensor(0.01)}
        row += n
    return out


def _block(p: str, cfg: dict, ratio: int, hashed: bool, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One decoder block's tensors under prefix `p` (`layers.N` or `mtp.N`)."""
    hidden, rank, heads, head = cfg["hidden_size"], cfg["q_lora_rank"], cfg["num_attention_heads"], cfg["head_dim"]
    groups, inter, hc = cfg["o_groups"], cfg["moe_intermediate_size"], cfg["hc_mult"]
    mix = (2 + hc) * hc
    out = {f"{p}.attn_norm.weight": _bf16((hidden,), gen), f"{p}.ffn_norm.weight": _bf16((hidden,), gen),
           f"{p}.attn.attn_sink": torch.zeros(heads), f"{p}.attn.q_norm.weight": _bf16((rank,), gen),
           f"{p}.attn.kv_norm.weight": _bf16((head,), gen), f"{p}.ffn.gate.weight": _bf16((cfg["n_routed_experts"], hidden), gen)}
    for mixer in ("attn", "ffn"):
        out |= {f"{p}.hc_{mixer}_fn": torch.randn(mix, hc * hidden, generator=gen), f"{p}.hc_{mixer}_base": torch.randn(mix, generator=gen),
                f"{p}.hc_{mixer}_scale": torch.rand(3, generator=gen)}
    out |= fp8_block(f"{p}.attn.wq_a", rank, hidden, gen) | fp8_block(f"{p}.attn.wkv", head, hidden, gen)
    out |= fp8_block(f"{p}.attn.wq_b", heads * head, rank, gen)
    out |= fp8_block(f"{p}.attn.wo_a", groups * cfg["o_lora_rank"], heads * head // groups, gen)
    out |= fp8_block(f"{p}.attn.wo_b", hidden, groups * cfg["o_lora_rank"], gen)
    if ratio:
        out |= _compressor(f"{p}.attn.compressor", head, ratio, hidden, gen)
    if ratio == 4:
        index_head = cfg["index_head_dim"]
        out |= _compressor(f"{p}.attn.indexer.compressor", index_head, ratio, hidden, gen)
        out |= fp8_block(f"{p}.attn.indexer.wq_b", cfg["index_n_heads"] * index_head, rank, gen)
        out[f"{p}.attn.indexer.weights_proj.weight"] = _bf16((cfg["index_n_heads"], hidden), gen)
    if hashed:
        out[f"{p}.ffn.gate.tid2eid"] = torch.randint(0, cfg["n_routed_experts"], (cfg["vocab_size"], cfg["num_experts_per_tok"]),
                                                     generator=gen, dtype=torch.int32)
    else:
        out[f"{p}.ffn.gate.bias"] = torch.zeros(cfg["n_routed_experts"])
    for w in ("w1", "w2", "w3"):
        shape = (hidden, inter) if w == "w2" else (inter, hidden)
        out |= fp8_block(f"{p}.ffn.shared_experts.{w}", *shape, gen)
    for e in range(cfg["n_routed_experts"]):
        experts = f"{p}.ffn.experts.{e}"
        out |= _nvfp4([f"{experts}.w1", f"{experts}.w3"], [inter, inter], hidden, gen)
        out |= _nvfp4([f"{experts}.w2"], [hidden], inter, gen)
    return out


def _compressor(p: str, head: int, ratio: int, hidden: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """A compressor (BF16, built without a quant config: compressor.py:276): overlapping windows at ratio 4 store
    twice the head."""
    width = head * (2 if ratio == 4 else 1)
    return {f"{p}.wkv.weight": _bf16((width, hidden), gen), f"{p}.wgate.weight": _bf16((width, hidden), gen),
            f"{p}.norm.weight": _bf16((head,), gen), f"{p}.ape": torch.randn(ratio, width, generator=gen)}


def tensors(cfg: dict, seed: int = 0, mtp: bool = False) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden, vocab, hc = cfg["hidden_size"], cfg["vocab_size"], cfg["hc_mult"]
    out = {"embed.weight": _bf16((vocab, hidden), gen), "head.weight": _bf16((vocab, hidden), gen),
           "norm.weight": _bf16((hidden,), gen), "hc_head_fn": torch.randn(hc, hc * hidden, generator=gen),
           "hc_head_base": torch.randn(hc, generator=gen), "hc_head_scale": torch.rand(1, generator=gen)}
    for i, ratio in enumerate(cfg["compress_ratios"][: cfg["num_hidden_layers"]]):
        out |= _block(f"layers.{i}", cfg, ratio, i < cfg["num_hash_layers"], gen)
    if mtp:
        out |= _block("mtp.0", cfg, 0, False, gen)
        out |= fp8_block("mtp.0.e_proj", hidden, hidden, gen) | fp8_block("mtp.0.h_proj", hidden, hidden, gen)
        out |= {"mtp.0.enorm.weight": _bf16((hidden,), gen), "mtp.0.hnorm.weight": _bf16((hidden,), gen),
                "mtp.0.norm.weight": _bf16((hidden,), gen), "mtp.0.hc_head_fn": torch.randn(hc, hc * hidden, generator=gen),
                "mtp.0.hc_head_base": torch.randn(hc, generator=gen), "mtp.0.hc_head_scale": torch.rand(1, generator=gen)}
    return out


def write(folder: Path, seed: int = 0, mtp: bool = False, edit=None) -> Path:
    """The tiny checkpoint in `folder` (created): config.json and model.safetensors; `edit(tensors)` may change the
    tensors before they are saved."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config()
    stored = tensors(cfg, seed, mtp)
    if edit is not None:
        edit(stored)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
