"""The fixture folders and probe configurations of test_probe_smoke.py (vLLM itself as a test consumer).

The folders are built in the test's own interpreter (torch, transformers, safetensors); the probe
loads them in the separate .venv-vllm. Folders:

* tiny assistants (hidden 64, backbone 96, intermediate 128, 2 layers sliding/full, vocab 128) built with
  transformers' Gemma4AssistantForCausalLM and save_pretrained, plus hand-edited variants:
  NVFP4-packed layer-0 down_proj declared in a modelopt quantization_config (with and without
  input_scale), every decoder linear packed and declared, the layer-0 packing without any
  quantization_config, and a BF16 model with a leftover pre_projection.weight_scale;
* folders with the real 31B assistant shapes (hidden 1024, backbone 5376, intermediate 8192,
  4 layers s,s,s,full, 32 heads, head_dim 256/512, vocab 262144), random small-std values written with
  safetensors directly. The ~1 GB of shared tensors are written once; each variant folder symlinks that
  shard and adds its own small shard with the layer-0 down_proj tensors, tied together by
  model.safetensors.index.json.

`RUNS` lists which folders each probe configuration (behaviour x TP size x TP rank) loads in its one process.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import torch as safetensors_torch

from .probe import read_all

# --------------------------------------------------------------------------------------------------------
# NVFP4 packing (modelopt checkpoint layout), by hand
# --------------------------------------------------------------------------------------------------------
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP8_MAX = 448.0
FP4_MAX = 6.0


def pack_nvfp4(w: "torch.Tensor", group: int = 16):
    """w [out, in] -> (uint8 [out, in/2], float8_e4m3fn [out, in/group], f32 0-d weight_scale_2).

    W ~= e2m1(code) * fp32(weight_scale[block]) * weight_scale_2; low nibble = even element,
    high nibble = odd element; bit 3 = sign.
    """
    out_f, in_f = w.shape
    assert in_f % group == 0
    wf = w.float()
    gscale = (wf.abs().max().clamp(min=1e-12) / (FP4_MAX * FP8_MAX)).float()
    blocks = wf.reshape(out_f, in_f // group, group)
    bscale = (blocks.abs().amax(-1) / FP4_MAX / gscale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    denom = bscale.float().unsqueeze(-1) * gscale
    scaled = torch.where(denom > 0, blocks / denom.clamp(min=1e-30), torch.zeros_like(blocks))
    table = torch.tensor(E2M1)
    mag = (scaled.abs().unsqueeze(-1) - table).abs().argmin(-1)
    code = (mag | ((scaled < 0).long() << 3)).to(torch.uint8).reshape(out_f, in_f)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed.contiguous(), bscale.contiguous(), gscale.reshape(())


def modelopt_qcfg(num_layers: int, quantized_layer: int = 0) -> dict:
    """modelopt-style config.json quantization_config: only layers.<q>.mlp.down_proj is NVFP4."""
    ignore = ["lm_head", "*pre_projection*", "*post_projection*", "*self_attn*", "*gate_up_proj*"]
    ignore += [f"*layers.{i}.mlp.down_proj*" for i in range(num_layers) if i != quantized_layer]
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ignore}


def packed_tensors(w: "torch.Tensor", prefix: str, input_scale: bool) -> dict:
    q, s, g = pack_nvfp4(w)
    t = {f"{prefix}.weight": q, f"{prefix}.weight_scale": s, f"{prefix}.weight_scale_2": g}
    if input_scale:
        t[f"{prefix}.input_scale"] = torch.tensor(1.0 / 448.0, dtype=torch.float32).reshape(())
    return t


# --------------------------------------------------------------------------------------------------------
# fixture folders
# --------------------------------------------------------------------------------------------------------
DOWN0 = "model.layers.0.mlp.down_proj"


def build_tiny_bf16(path: Path) -> None:
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, global_head_dim=64, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        num_kv_shared_layers=2, sliding_window=64, max_position_embeddings=512,
    )
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=96)
    cfg.architectures = ["Gemma4AssistantForCausalLM"]
    torch.manual_seed(1234)
    model = Gemma4AssistantForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # make every tensor distinctive (norms/layer_scalar are constant at init)
        for _, p in model.named_parameters():
            p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.fill_(0.5)
    model.save_pretrained(path)
    del model


def write_variant(src: Path, dst: Path, tensors: dict, quantization_config: dict | None) -> None:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    safetensors_torch.save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def real31b_config() -> dict:
    text = {
        "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 1024, "intermediate_size": 8192,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "num_attention_heads": 32, "num_key_value_heads": 16, "num_global_key_value_heads": 4,
        "attention_k_eq_v": True, "head_dim": 256, "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 262144, "sliding_window": 1024,
        "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0, "num_kv_shared_layers": 4, "enable_moe_block": False,
        "use_double_wide_mlp": False, "attention_bias": False, "tie_word_embeddings": True,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    }
    return {
        "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
        "backbone_hidden_size": 5376, "use_ordered_embeddings": False, "num_centroids": 2048,
        "centroid_intermediate_top_k": 32, "tie_word_embeddings": True, "dtype": "bfloat16",
        "text_config": text,
    }


def real31b_shapes() -> dict:
    H, B, I, N, V = 1024, 5376, 8192, 32, 262144
    shapes = {
        "model.embed_tokens.weight": [V, H],
        "pre_projection.weight": [H, 2 * B],
        "post_projection.weight": [B, H],
        "model.norm.weight": [H],
    }
    for i in range(4):
        d = 512 if i == 3 else 256
        p = f"model.layers.{i}"
        shapes.update({
            f"{p}.self_attn.q_proj.weight": [N * d, H],
            f"{p}.self_attn.o_proj.weight": [H, N * d],
            f"{p}.self_attn.q_norm.weight": [d],
            f"{p}.mlp.gate_proj.weight": [I, H],
            f"{p}.mlp.up_proj.weight": [I, H],
            f"{p}.mlp.down_proj.weight": [H, I],
            f"{p}.layer_scalar": [1],
        })
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            shapes[f"{p}.{n}.weight"] = [H]
    return shapes


def build_real31b(root: Path) -> dict:
    """Shared ~1 GB shard (everything but layer-0 down_proj) + variant folders that link to it."""
    gen = torch.Generator().manual_seed(31)
    shapes = real31b_shapes()
    base = {}
    for name, shape in shapes.items():
        if name.startswith(DOWN0):
            continue
        if name.endswith("layer_scalar"):
            base[name] = torch.full(shape, 0.5, dtype=torch.bfloat16)
        elif len(shape) == 1:
            base[name] = (1.0 + 0.01 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        else:
            base[name] = (0.02 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    shared = root / "_shared"
    shared.mkdir()
    safetensors_torch.save_file(base, str(shared / "base.safetensors"), metadata={"format": "pt"})
    base_names = sorted(base)
    del base
    down = (0.02 * torch.randn(shapes[f"{DOWN0}.weight"], generator=gen)).to(torch.bfloat16)

    variants = {
        "r31_bf16": ({f"{DOWN0}.weight": down}, None),
        "r31_nvfp4": (packed_tensors(down, DOWN0, input_scale=True), modelopt_qcfg(4)),
        "r31_packed_undeclared": ({f"{DOWN0}.weight": pack_nvfp4(down)[0]}, None),
    }
    out = {}
    cfg = real31b_config()
    for vname, (extra, qcfg) in variants.items():
        d = root / vname
        d.mkdir()
        os.symlink(shared / "base.safetensors", d / "model-00001-of-00002.safetensors")
        safetensors_torch.save_file(extra, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
        weight_map = {n: "model-00001-of-00002.safetensors" for n in base_names}
        weight_map.update({n: "model-00002-of-00002.safetensors" for n in extra})
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))
        c = dict(cfg)
        if qcfg is not None:
            c["quantization_config"] = qcfg
        (d / "config.json").write_text(json.dumps(c, indent=2))
        out[vname] = d
    return out


def build_folders(root: Path) -> dict:
    """Every fixture folder, built under `root`: {name: Path}."""
    tiny = root / "tiny_bf16"
    build_tiny_bf16(tiny)
    t = read_all(tiny)
    down = t[f"{DOWN0}.weight"]
    rest = {k: v for k, v in t.items() if not k.startswith(DOWN0)}
    full = dict(t)  # every decoder linear NVFP4 (pre/post_projection, lm_head stay BF16 and are ignored)
    for k in sorted(t):
        if k.endswith("_proj.weight") and k.startswith("model.layers."):
            full.update(packed_tensors(full.pop(k), k[: -len(".weight")], input_scale=True))
    full_qcfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                 "ignore": ["lm_head", "*pre_projection*", "*post_projection*"]}
    out = {"tiny_bf16": tiny}
    for name, tensors, qcfg in (
        ("tiny_nvfp4", {**rest, **packed_tensors(down, DOWN0, input_scale=True)}, modelopt_qcfg(2)),
        ("tiny_nvfp4_no_input_scale", {**rest, **packed_tensors(down, DOWN0, input_scale=False)}, modelopt_qcfg(2)),
        ("tiny_nvfp4_full", full, full_qcfg),
        ("tiny_packed_undeclared", {**rest, f"{DOWN0}.weight": pack_nvfp4(down)[0]}, None),
        ("tiny_leftover_scale", {**t, "pre_projection.weight_scale":
                                 torch.ones(64, 192 // 16).to(torch.float8_e4m3fn)}, None),
    ):
        write_variant(tiny, root / name, tensors, qcfg)
        out[name] = root / name
    out.update(build_real31b(root))
    return out


# --------------------------------------------------------------------------------------------------------
# probe configurations
# --------------------------------------------------------------------------------------------------------
TINY = ["tiny_bf16", "tiny_nvfp4", "tiny_nvfp4_full", "tiny_nvfp4_no_input_scale", "tiny_packed_undeclared",
        "tiny_leftover_scale"]
R31 = ["r31_bf16", "r31_nvfp4", "r31_packed_undeclared"]
# (behaviour, tp_size, tp_rank) -> folders loaded in that one probe process (always with --hash)
RUNS = {
    ("installed", 1, 0): TINY + R31,
    ("legacy", 1, 0): TINY + R31,
    ("installed", 2, 1): ["tiny_bf16", "r31_bf16", "r31_packed_undeclared"],
    ("legacy", 2, 1): ["tiny_bf16", "tiny_nvfp4", "tiny_nvfp4_full", "r31_bf16", "r31_nvfp4"],
    ("legacy", 2, 0): ["tiny_nvfp4", "tiny_nvfp4_full"],
}
