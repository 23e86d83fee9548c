"""Published layouts as a careless export changes them (tools/real_fixture.py writes the published ones): the
names, shards and configs stay the world's, one decision is made the other way."""

from __future__ import annotations

import json
from pathlib import Path

from tools.real_fixture import REAL_MODELS, RealModel, write_real_model


def write_gemma4_vision_packed(folder: Path) -> Path:
    """gemma-4-31b-it with its vision encoder's linears stored NVFP4 and no longer excluded (`model.vision_tower*`
    narrowed to its patch embedder), as a quantize-every-linear export writes it: vLLM 0.32's Gemma 4 builds the vision
    tower unquantized under ModelOpt NVFP4 (its generated row's `modelopt_fp4_only`), so this copy must not load."""
    model = REAL_MODELS["gemma-4-31b-it"]
    variant = RealModel(model.real, model.fmt, model.architecture, model.config, kv_fp8=model.kv_fp8,
                        bf16=r"\.self_attn\.[qkvo]_proj$|^model\.vision_tower\.patch_embedder\.|^model\.embed_vision\.|^lm_head$")
    out = write_real_model(folder, "gemma-4-31b-it", variant)
    quant = json.loads((out / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] = [e if e != "model.vision_tower*" else "model.vision_tower.patch_embedder*"
                                                for e in quant["quantization"]["exclude_modules"]]
    (out / "hf_quant_config.json").write_text(json.dumps(quant, indent=4))
    return out
