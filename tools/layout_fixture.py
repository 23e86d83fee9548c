"""Tiny checkpoints from a recorded tensor layout (name -> dtype, shape) and real config files.

tests/data/real/<name>/tensors.json records a producer's real export's safetensors header (ModelOpt's EAGLE-3
exporter, its GLM-4.x MoE export; tools/modelopt_eagle_export.py, tools/modelopt_glm_export.py). `write_layout`
writes a checkpoint with exactly those names, dtypes and shapes: each packed NVFP4 module is a random BF16 weight
quantized with the project's codec (bitwise ModelOpt's), scalar scales are positive, the rest is random BF16.
`compressed_tensors=True` stores compressed-tensors' names instead (weight_packed, weight_global_scale = 1 / scale_2,
input_global_scale = 1 / input_scale), and `drop` leaves tensors out (an NVFP4A16 export has no activation scales).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.codec import nvfp4

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real"
DTYPES = {"BF16": torch.bfloat16, "F32": torch.float32, "F16": torch.float16, "I64": torch.int64}
SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
CT_NAMES = {"weight": "weight_packed", "weight_scale_2": "weight_global_scale", "input_scale": "input_global_scale"}


def layout(real: str) -> dict[str, tuple[str, tuple[int, ...]]]:
    """tests/data/real/<real>/tensors.json: tensor name -> (dtype, shape)."""
    raw = json.loads((REAL / real / "tensors.json").read_text())
    return {name: (dtype, tuple(shape)) for name, (dtype, shape) in raw.items()}


def layout_tensors(names: dict[str, tuple[str, tuple[int, ...]]], seed: int = 0) -> dict[str, torch.Tensor]:
    """A value for every tensor of the layout (packed modules quantized from a random weight)."""
    gen = torch.Generator().manual_seed(seed)
    full = {n[: -len(".weight")]: (torch.randn(s[0], s[1] * 2, generator=gen) * 0.05).to(torch.bfloat16)
            for n, (d, s) in names.items() if n.endswith(".weight") and d == "U8"}
    out: dict[str, torch.Tensor] = {}
    inputs: dict[str, float] = {}  # fused siblings read one input: one input_scale (tools/real_fixture.py input_group)
    for name, (dtype, shape) in names.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and dtype == "U8":
            siblings = [s for s in _siblings(module) if s in full]  # ModelOpt gives fused siblings one weight_scale_2
            packed, scale, scale_2 = nvfp4.quantize(full[module], max(nvfp4.global_scale(full[s]) for s in siblings))
            out.update({name: packed, f"{module}.weight_scale": scale, f"{module}.weight_scale_2": scale_2})
        elif dtype == "F32" and len(shape) == 0:
            drawn = 0.01 + torch.rand((), generator=gen).item()
            if leaf == "input_scale":  # the first sibling's draw, for every sibling (each still draws: the rest unchanged)
                drawn = inputs.setdefault(_siblings(module)[0], drawn)
            out.setdefault(name, torch.tensor(drawn))
        elif dtype == "I64":
            out[name] = torch.arange(shape[0], dtype=torch.int64)
        elif dtype != "F8_E4M3":
            out[name] = (torch.randn(shape, generator=gen) * 0.05).to(DTYPES[dtype])
    missing = set(names) - set(out)
    if missing:
        raise ValueError(f"layout tensors this builder cannot make: {sorted(missing)[:5]}")
    return out


def _siblings(module: str) -> list[str]:
    parent, _, leaf = module.rpartition(".")
    group = next((g for g in SIBLINGS if leaf in g), (leaf,))
    return [f"{parent}.{s}" if parent else s for s in group]


def as_compressed_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """compressed-tensors' names and divisor global scales for ModelOpt's packed leaves."""
    out = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        packed = f"{module}.weight_scale" in tensors
        if packed and leaf in CT_NAMES:
            out[f"{module}.{CT_NAMES[leaf]}"] = t if leaf == "weight" else 1.0 / t
        else:
            out[name] = t
    return out


def write_layout(folder: Path, real: str, config: dict | None = None, hf_quant: dict | None | bool = True, *,
                 compressed_tensors: bool = False, drop=lambda name: False, change: dict | None = None, seed: int = 0) -> Path:
    """A checkpoint of `real`'s layout in `folder` (replaced). config: config.json contents (default: the real one);
    hf_quant: True copies the real hf_quant_config.json, a dict writes that, None/False writes none; change: tensors
    whose (dtype, shape) replace the layout's (a U8 weight brings its scales)."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tensors = layout_tensors({**layout(real), **(change or {})}, seed)  # change: name -> (dtype, shape) replacing the real one
    if compressed_tensors:
        tensors = as_compressed_tensors(tensors)
    kept = {n: t.contiguous() for n, t in sorted(tensors.items()) if not drop(n)}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    config = config if config is not None else json.loads((REAL / real / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config, indent=4))
    if hf_quant is True:
        shutil.copy(REAL / real / "hf_quant_config.json", folder)
    elif hf_quant:
        (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4))
    return folder


def real_json(real: str, name: str) -> dict:
    return json.loads((REAL / real / name).read_text())
