"""The published reports' layouts of issue #28, built once for both consumer tiers (the vLLM tier's
tests/vllm/test_multitarget_fix_loads_in_vllm.py and the SGLang tier's tests/sglang/test_fix_loads_in_sglang.py load
the same fix outputs): Gemma-4's vision tower excluded by `.linear` names (sglang#24927), GLM's `*.self_attn.q_proj`
excluded while SGLang fuses qkv_proj (sglang#36596, on the real GLM-4 MoE export and on Qwen3-32B), lm_head excluded
but stored with its NVFP4 scales (vllm#45102)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tools.layout_fixture import write_layout
from tools.real_fixture import write_real_model


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=4))


def gemma4_vision_linear(folder: Path) -> Path:
    """sglang#24927: the vision tower excluded by its modules' stored names, which end in `.linear`."""
    write_real_model(folder, "gemma-4-31b-it")
    names = sorted({k.rsplit(".", 1)[0] for k in load_file(folder / "model.safetensors")
                    if k.startswith("model.vision_tower.") and k.endswith(".linear.weight")})
    edit_json(folder / "hf_quant_config.json", lambda d: d["quantization"].__setitem__(
        "exclude_modules", [e for e in d["quantization"]["exclude_modules"] if e != "model.vision_tower*"] + names))
    return folder


def gemma4_vision_k_v_packed(folder: Path) -> Path:
    """The `.linear` layout with the vision k/v stored NVFP4 and not excluded, q BF16 and excluded as stored: SGLang
    builds the fused q/k/v NVFP4 (no shard name listed), so q cannot load; excluding q under SGLang's name alone would
    split the fused layer (SGLang raises), so a repair dequantizes k and v too."""
    from repair.codec import nvfp4

    gemma4_vision_linear(folder)
    tensors = load_file(folder / "model.safetensors")
    for shard in ("k_proj", "v_proj"):
        module = f"model.vision_tower.encoder.layers.0.self_attn.{shard}.linear"
        packed, scales, scale_2 = nvfp4.quantize(tensors.pop(module + ".weight").float())
        tensors |= {module + ".weight": packed, module + ".weight_scale": scales, module + ".weight_scale_2": scale_2,
                    module + ".input_scale": torch.tensor(1.0)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    edit_json(folder / "hf_quant_config.json", lambda d: d["quantization"].__setitem__("exclude_modules", [
        e for e in d["quantization"]["exclude_modules"] if not e.endswith(("k_proj.linear", "v_proj.linear"))]))
    return folder


def glm_q_proj_excluded(folder: Path) -> Path:
    """sglang#36596: `*.self_attn.q_proj` excluded and q_proj stored BF16, on the real GLM-4 MoE export's layout."""
    from repair.codec import nvfp4

    write_layout(folder, "modelopt-glm4-moe")
    tensors = load_file(folder / "model.safetensors")
    for module in sorted({k.removesuffix(".weight") for k in tensors if k.endswith(".self_attn.q_proj.weight")}):
        leaves = {leaf: tensors.pop(f"{module}.{leaf}") for leaf in ("weight", "weight_scale", "weight_scale_2", "input_scale")}
        tensors[f"{module}.weight"] = nvfp4.dequantize(leaves["weight"], leaves["weight_scale"], leaves["weight_scale_2"]).to(torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    edit_json(folder / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].append("*.self_attn.q_proj"))
    edit_json(folder / "config.json", lambda d: d["quantization_config"]["ignore"].append("*.self_attn.q_proj"))
    return folder


def qwen3_q_proj_wildcard(folder: Path) -> Path:
    """sglang#36596's exclusion on Qwen3-32B: every q_proj BF16 and excluded by `*.self_attn.q_proj`."""
    from dataclasses import replace

    from tools.real_fixture import REAL_MODELS

    write_real_model(folder, "qwen3-32b", replace(REAL_MODELS["qwen3-32b"], bf16=r"\.self_attn\.q_proj$|^lm_head$"))
    edit_json(folder / "hf_quant_config.json", lambda d: d["quantization"].__setitem__("exclude_modules", ["lm_head", "*.self_attn.q_proj"]))
    return folder


def lm_head_with_scales(folder: Path) -> Path:
    """vllm#45102: lm_head excluded and stored BF16, but its NVFP4 scales are still in the checkpoint."""
    write_real_model(folder, "qwen3-32b")
    tensors = load_file(folder / "model.safetensors")
    tensors.update({"lm_head.input_scale": torch.tensor(1.0), "lm_head.weight_scale_2": torch.tensor(0.5)})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


REPORTS = {"gemma4-vision-linear": gemma4_vision_linear, "glm-q_proj-excluded": glm_q_proj_excluded,
           "qwen3-q_proj-wildcard": qwen3_q_proj_wildcard, "lm_head-scales": lm_head_with_scales}


def build_reports(root: Path) -> dict[str, Path]:
    return {name: build(root / name) for name, build in REPORTS.items()}
