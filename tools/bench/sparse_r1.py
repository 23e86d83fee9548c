"""A DeepSeek-R1 NVFP4 checkpoint at its real size, as sparse files: the real names, shapes, dtypes and sharding of
nvidia/DeepSeek-R1-FP4 (163 shards, 180,730 tensors, 44,849 NVFP4 modules, ~412 GB apparent), where only the
headers, the float32 scalars and (as asked) the block scales hold bytes; everything else is a file hole.

Layout as safetensors' own writer lays a shard out (tests/test_scale_reads.py checks it against `save_file`):
float32 tensors first, then BF16, then float8 (the block scales), then uint8 (the packed weights), each by name.
So a shard's scalars are one run right after its header, and its block scales one run before the packed weights.

`blocks`: "all" writes every block-scale byte (healthy codes 0x30-0x7E); "sample" only the pages doctor's
default sample reads (the first and last 4 KiB of each tensor: a stand-in that keeps 41.6 GB off the disk; the
rest are holes, so --deep on it counts zeros); "none" leaves them holes. hf_quant_config.json is the real one
(tests/data/real/deepseek-r1-fp4, ModelOpt 0.23: only that file declares the quantization); `exclusions`
"0.23" keeps its 489 exact names, "summarized" writes the same set with prefix wildcards as newer ModelOpt does.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path

HIDDEN, DENSE_FF, EXPERT_FF, VOCAB = 7168, 18432, 2048, 129280
Q_LORA, KV_LORA, HEADS, ROPE, NOPE, V_HEAD = 1536, 512, 128, 64, 128, 128
PROJ = ("gate_proj", "up_proj", "down_proj")
REAL = Path(__file__).resolve().parents[2] / "tests" / "data" / "real" / "deepseek-r1-fp4"
PAGE = 4096
_CODES = bytes(range(0x30, 0x7F))  # healthy float8_e4m3fn block scales, 0.75 ... 448
SUMMARIZED = ["lm_head", "model.embed_tokens", "model.norm"] + [f"model.layers.*.{m}" for m in (
    "input_layernorm", "post_attention_layernorm", "self_attn.kv_a_proj_with_mqa", "self_attn.q_b_proj", "self_attn.kv_a_layernorm",
    "self_attn.kv_b_proj", "mlp.gate")]
_ORDER = {"F32": 0, "BF16": 1, "F8_E4M3": 2, "U8": 3}  # safetensors: larger alignment first, then the name


def _linear(name: str, out: int, inp: int, packed: bool) -> list[tuple[str, str, tuple[int, ...]]]:
    if not packed:
        return [(f"{name}.weight", "BF16", (out, inp))]
    return [(f"{name}.input_scale", "F32", ()), (f"{name}.weight", "U8", (out, inp // 2)),
            (f"{name}.weight_scale", "F8_E4M3", (out, inp // 16)), (f"{name}.weight_scale_2", "F32", ())]


def _mlp(p: str, ff: int, packed: bool) -> list:
    return [t for proj in PROJ for t in _linear(f"{p}.{proj}", HIDDEN if proj == "down_proj" else ff,
                                                   ff if proj == "down_proj" else HIDDEN, packed)]


def _layer(i: int, experts: int, dense: int, packed: bool) -> list:
    p = f"model.layers.{i}"
    out = [(f"{p}.input_layernorm.weight", "BF16", (HIDDEN,)), (f"{p}.post_attention_layernorm.weight", "BF16", (HIDDEN,)),
           (f"{p}.self_attn.q_a_layernorm.weight", "BF16", (Q_LORA,)), (f"{p}.self_attn.kv_a_layernorm.weight", "BF16", (KV_LORA,))]
    out += _linear(f"{p}.self_attn.q_a_proj", Q_LORA, HIDDEN, packed) + _linear(f"{p}.self_attn.o_proj", HIDDEN, HEADS * V_HEAD, packed)
    out += _linear(f"{p}.self_attn.q_b_proj", HEADS * (NOPE + ROPE), Q_LORA, False)
    out += _linear(f"{p}.self_attn.kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN, False)
    out += _linear(f"{p}.self_attn.kv_b_proj", HEADS * (NOPE + V_HEAD), KV_LORA, False)
    if i < dense:
        return out + _mlp(f"{p}.mlp", DENSE_FF, packed)
    out += [(f"{p}.mlp.gate.weight", "BF16", (experts, HIDDEN)), (f"{p}.mlp.gate.e_score_correction_bias", "F32", (experts,))]
    out += _mlp(f"{p}.mlp.shared_experts", EXPERT_FF, packed)
    return out + [t for e in range(experts) for t in _mlp(f"{p}.mlp.experts.{e}", EXPERT_FF, packed)]


def tensors(layers: int = 61, experts: int = 256, dense: int = 3) -> list[tuple[str, str, tuple[int, ...]]]:
    """Every tensor, module by module as the index assigns them to shards; the MTP layer (the last) is BF16."""
    out = [("model.embed_tokens.weight", "BF16", (VOCAB, HIDDEN))]
    for i in range(layers):
        out += _layer(i, experts, dense, True)
    mtp = f"model.layers.{layers}"
    out += _layer(layers, experts, dense, False) + [(f"{mtp}.eh_proj.weight", "BF16", (HIDDEN, 2 * HIDDEN)),
                                                     (f"{mtp}.enorm.weight", "BF16", (HIDDEN,)), (f"{mtp}.hnorm.weight", "BF16", (HIDDEN,)),
                                                     (f"{mtp}.embed_tokens.weight", "BF16", (VOCAB, HIDDEN)),
                                                     (f"{mtp}.shared_head.norm.weight", "BF16", (HIDDEN,)),
                                                     (f"{mtp}.shared_head.head.weight", "BF16", (VOCAB, HIDDEN))]
    return out + [("model.norm.weight", "BF16", (HIDDEN,)), ("lm_head.weight", "BF16", (VOCAB, HIDDEN))]


def write(folder: Path, layers: int = 61, experts: int = 256, dense: int = 3, shards: int = 163, blocks: str = "sample",
          exclusions: str = "summarized") -> Path:
    """Write the checkpoint into `folder` (which must not exist); returns it."""
    from repair.io.dtypes import nbytes

    folder.mkdir(parents=True, exist_ok=False)
    try:
        names = tensors(layers, experts, dense)
        per_shard = -(-len(names) // shards)
        weight_map = {}
        for i in range(shards):
            part = names[i * per_shard:(i + 1) * per_shard]
            shard = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
            _write_shard(folder / shard, sorted(part, key=lambda t: (_ORDER[t[1]], t[0])), nbytes, blocks)
            weight_map.update({name: shard for name, _, _ in part})
        (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
        _write_configs(folder, layers, experts, dense, exclusions)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def _write_shard(path: Path, part: list, nbytes, blocks: str) -> None:
    header, offset, writes = {}, 0, []
    for name, dtype, shape in part:
        size = nbytes(dtype, shape)
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        if dtype == "F32" and not shape:
            writes.append((offset, struct.pack("<f", 0.0005 if name.endswith("weight_scale_2") else 0.02)))
        elif dtype == "F8_E4M3" and blocks != "none":
            writes += _block_bytes(offset, size, blocks)
        offset += size
    raw = json.dumps({"__metadata__": {"format": "pt"}, **header}, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        fh.truncate(start + offset)  # everything not written below is a hole: zeros that take no disk
        for at, data in writes:
            os.pwrite(fh.fileno(), data, start + at)


def _block_bytes(offset: int, size: int, blocks: str) -> list[tuple[int, bytes]]:
    if blocks == "all":
        chunk = 1 << 20
        return [(offset + at, (_CODES * (min(chunk, size - at) // len(_CODES) + 1))[:min(chunk, size - at)]) for at in range(0, size, chunk)]
    head = min(size, PAGE)
    tail = min(size - head, PAGE)
    return [(offset, (_CODES * (head // len(_CODES) + 1))[:head])] + ([(offset + size - tail, _CODES[-1:] * tail)] if tail else [])


def _write_configs(folder: Path, layers: int, experts: int, dense: int, exclusions: str) -> None:
    config = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": HIDDEN,
              "intermediate_size": DENSE_FF, "moe_intermediate_size": EXPERT_FF, "n_routed_experts": experts, "n_shared_experts": 1,
              "num_hidden_layers": layers, "num_nextn_predict_layers": 1, "first_k_dense_replace": dense,
              "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "q_lora_rank": Q_LORA, "kv_lora_rank": KV_LORA,
              "qk_rope_head_dim": ROPE, "qk_nope_head_dim": NOPE, "v_head_dim": V_HEAD, "vocab_size": VOCAB, "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    hf = json.loads((REAL / "hf_quant_config.json").read_text())
    if exclusions == "summarized":  # the same set as ModelOpt >= 0.3x writes it: prefix wildcards, not 489 names
        hf["quantization"]["exclude_modules"] = SUMMARIZED + [f"model.layers.{layers}*"]
    else:
        exclude = hf["quantization"]["exclude_modules"]
        hf["quantization"]["exclude_modules"] = [e for e in exclude if not e.startswith("model.layers.") or _layer_of(e) < layers] + \
            ([f"model.layers.{layers}*"] if layers != 61 else [])
    (folder / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))


def _layer_of(entry: str) -> int:
    digits = entry.split(".")[2].rstrip("*")
    return int(digits) if digits.isdigit() else 0
