"""Broken variants of the real Qwen3-32B NVFP4 fixture, one loader path each (SGLang's row-parallel, merged-column
and QKV loaders, in both directions: a packed tensor into a layer SGLang builds BF16, a BF16 tensor into a layer
it builds NVFP4)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.test_config_forms import qwen3_with_bf16_shard
from tools.real_fixture import write_real_model

LAYER = "model.layers.0"


def excluded_but_packed(folder: Path, modules: tuple[str, ...]) -> Path:
    """The healthy export, with `modules` added to its exclusions while they stay packed NVFP4 on disk."""
    write_real_model(folder, "qwen3-32b")
    hf = json.loads((folder / "hf_quant_config.json").read_text())
    hf["quantization"]["exclude_modules"] += [f"{LAYER}.{m}" for m in modules]
    (folder / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    return folder


# name -> builder(folder); the SGLang layer each one exercises is in the name
DEFECTS = {
    "row-packed-into-bf16": lambda f: excluded_but_packed(f, ("self_attn.o_proj",)),
    "merged-packed-into-bf16": lambda f: excluded_but_packed(f, ("mlp.gate_proj", "mlp.up_proj")),
    "qkv-packed-into-bf16": lambda f: excluded_but_packed(f, ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    "row-bf16-into-packed": lambda f: qwen3_with_bf16_shard(f, f"{LAYER}.self_attn.o_proj"),
    "merged-bf16-into-packed": lambda f: qwen3_with_bf16_shard(f, f"{LAYER}.mlp.up_proj"),
    "qkv-bf16-into-packed": lambda f: qwen3_with_bf16_shard(f, f"{LAYER}.self_attn.k_proj"),
}


def build_defects(root: Path) -> dict[str, Path]:
    return {name: build(root / name) for name, build in DEFECTS.items()}
