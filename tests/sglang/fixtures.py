"""Tiny checkpoints of every real-config fixture in tests/data/real/, built the way the main suite builds them.

Each folder in tests/data/real/ maps to one builder here (REAL_FOLDERS); a folder without a builder fails
test_every_real_config_is_covered, so a new real config cannot be left out of the SGLang tier silently.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from tools.layout_fixture import write_layout
from tools.real_fixture import REAL, REAL_MODELS, real_weight_map, write_llama, write_real_model

# Qwen3-235B-A22B as published: the 30B-A3B architecture with its own 94 layers (its exclusions name all 94 routers)
QWEN3_235B = dataclasses.replace(REAL_MODELS["qwen3-30b-a3b"], real="qwen3-235b-a22b-nvfp4",
                                 config=dict(REAL_MODELS["qwen3-30b-a3b"].config, num_hidden_layers=94))


# deepseek-ai/DeepSeek-V3's (and R1's) published config.json values of these keys
DEEPSEEK_PUBLISHED = {"moe_layer_freq": 1, "scoring_func": "sigmoid", "ep_size": 1, "seq_aux": True, "aux_loss_alpha": 0.001}


def _real_model(key, model=None):
    return lambda folder: _published_keys(write_real_model(folder, key, model))


def _published_keys(folder: Path) -> Path:
    """DeepSeek-V3/R1 publish keys of their own configuration class in config.json that transformers'
    DeepseekV3Config drops and SGLang's deepseek_v2.py reads (DEEPSEEK_PUBLISHED); the builder's file lacks them."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("model_type") == "deepseek_v3":
        (folder / "config.json").write_text(json.dumps(config | DEEPSEEK_PUBLISHED, indent=2))
    return folder


# fixture name -> (tests/data/real folder it is built from, builder(folder) -> folder)
FIXTURES = {
    **{key: (model.real, _real_model(key)) for key, model in REAL_MODELS.items()},
    "qwen3-235b-a22b": ("qwen3-235b-a22b-nvfp4", _real_model("qwen3-30b-a3b", QWEN3_235B)),
    "llama-3.1-8b": ("llama-3.1-8b-instruct-fp4", lambda folder: write_llama(
        folder, "llama-3.1-8b-instruct-fp4", real_weight_map("llama-3.1-8b-instruct-fp4"))),
    "modelopt-glm4-moe": ("modelopt-glm4-moe", lambda folder: write_layout(folder, "modelopt-glm4-moe")),
    "modelopt-eagle3-draft": ("modelopt-eagle3-draft", lambda folder: write_layout(folder, "modelopt-eagle3-draft")),
}

# real folders that are not whole checkpoints SGLang can build here, and why
NOT_BUILT: dict[str, str] = {}

# real folders whose SGLang decisions are checked layer by layer without a whole load, and the test that does it:
# SGLang 0.5.23's DeepseekV4ForCausalLM is built on the meta device, but a quant config that refuses one of its layers
# stops the build, and its load needs GPU kernels; so its own quant config is asked every layer of its own model
RULES_CHECKED = {
    "deepseek-v4-flash-nvfp4": "tests/sglang/test_dsv4_layers_vs_sglang.py",
    "redhatai-deepseek-v4-flash-nvfp4-fp8": "tests/sglang/test_dsv4_layers_vs_sglang.py",
}


def real_folders() -> set[str]:
    return {p.name for p in REAL.iterdir() if p.is_dir()}


def build_all(root: Path) -> dict[str, Path]:
    return {name: build(root / name) for name, (_, build) in FIXTURES.items()}
