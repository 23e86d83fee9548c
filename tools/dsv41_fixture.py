"""A tiny DeepSeek-V4.1-shaped checkpoint: V4's tiny published layers (tools/dsv4_fp8_fixture.py) with V4.1's attention.

No published V4.1 config.json is in the corpora reachable here (looked for: tests/data/real/PROVENANCE.md); its layer
roles are read from SGLang 0.5.23's own config class (configs/deepseek_v41.py: model_type `deepseek_v41`, the
`DeepseekV41ForCausalLM` it renames to `DeepseekV4ForCausalLM`, `kv_source_layer_ids`, `index_source_layer_ids`) and
its attention (models/deepseek_v4.py:1481-1497, layers/attention/dsv4/dsv41_sparse.py:112-236). V4.1's
`compress_ratios` take 0, 1 and 2: a layer whose ratio is 1 or 2 stores a compressor (`norm`, `wkv`, and at ratio 2
`wgate`; no `ape`) only where it is listed in `kv_source_layer_ids`, an indexer (`wq_b`, `weights_proj`) only where it is
listed in `index_source_layer_ids`, and that indexer's own keys (`wk`, `k_norm`) only where it is both. The published
layout's structure (40 layers: ratios 0, 0, eighteen 2s, twenty 1s; kv sources 2, 8, 14, 20; index sources those and
24, 28, 32, 36) is given by several public readers of it (e.g. NVIDIA NeMo-Automodel's and xLLM's V4.1 tests) and is
`PUBLISHED` here, cut to the layers a test asks for.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from tools import dsv4_fp8_fixture as v4

PUBLISHED = {"compress_ratios": [0, 0] + [2] * 18 + [1] * 20, "kv_source_layer_ids": [2, 8, 14, 20],
             "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36]}
# every ratio has a layer each list names, one only the index list names and one neither names (the rule is learned
# from it: tools/sglang_layer_drops.py)
TINY = {"compress_ratios": [0, 0, 2, 2, 2, 1, 1, 1], "kv_source_layer_ids": [2, 5], "index_source_layer_ids": [2, 3, 5, 6]}
V41 = {"model_type": "deepseek_v41", "architectures": ["DeepseekV41ForCausalLM"], "num_hash_layers": 0,
       "candidate_source_layer_id": -1, "engram_layer_ids": []}


def config(layout: dict | None = None) -> dict:
    """V4's tiny published config made V4.1 (`layout`: compress_ratios and the two source lists; TINY by default),
    without a quantization_config (the checkpoint's quantization is the test's choice)."""
    layout = TINY if layout is None else layout
    out = {k: v for k, v in v4.config().items() if v is not None and k != "quantization_config"} | V41 | layout
    return out | {"num_hidden_layers": len(layout["compress_ratios"])}


def tensors(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every tensor of the V4.1 layout `cfg` describes: V4's tensors of a ratio-0 layer, plus each layer's V4.1 compressor
    and indexer as its ratio and the two source lists say."""
    gen = torch.Generator().manual_seed(seed)
    flat = dict(cfg, compress_ratios=[0] * cfg["num_hidden_layers"], num_hash_layers=0)
    out = v4.tensors(flat, seed)
    hidden, head, index_head = cfg["hidden_size"], cfg["head_dim"], cfg["index_head_dim"]
    for i, ratio in enumerate(cfg["compress_ratios"]):
        p = f"layers.{i}.attn"
        kv, index = i in cfg["kv_source_layer_ids"], i in cfg["index_source_layer_ids"]
        if ratio in (1, 2) and kv:
            out |= {f"{p}.compressor.norm.weight": v4._bf16((head,), gen),
                    f"{p}.compressor.wkv.weight": v4._bf16((head, hidden), gen)}
            if ratio == 2:
                out[f"{p}.compressor.wgate.weight"] = v4._bf16((head, hidden), gen)
        if ratio in (1, 2) and index:
            out |= v4.fp8_block(f"{p}.indexer.wq_b", cfg["index_n_heads"] * index_head, cfg["q_lora_rank"], gen)
            out[f"{p}.indexer.weights_proj.weight"] = v4._bf16((cfg["index_n_heads"], hidden), gen)
            if kv:
                out |= {f"{p}.indexer.wk.weight": v4._bf16((index_head, head), gen),
                        f"{p}.indexer.k_norm.weight": v4._bf16((index_head,), gen)}
    return out


def write(folder: Path, layout: dict | None = None, lose: str | None = None) -> Path:
    """config.json and model.safetensors in `folder` (created); `lose`: a module whose tensors are left out."""
    folder.mkdir(parents=True, exist_ok=True)
    cfg = config(layout)
    stored = {k: v for k, v in tensors(cfg).items() if not (lose and k.startswith(f"{lose}."))}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder
