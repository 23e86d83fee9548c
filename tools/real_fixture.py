"""Tiny checkpoints with a published checkpoint's real tensor names, shard assignment and quantization
config (tests/data/real/): the names and layout are the world's, only the sizes are ours.

NVFP4 weights are packed with the project's codec (bitwise ModelOpt's, tests/test_codec_nvfp4.py).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.codec import nvfp4

REAL = Path(__file__).resolve().parents[1] / "tests" / "data" / "real"
HIDDEN, INTER, KV, VOCAB = 64, 128, 32, 256
PROJ_SHAPES = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (KV, HIDDEN), "v_proj": (KV, HIDDEN), "o_proj": (HIDDEN, HIDDEN),
               "gate_proj": (INTER, HIDDEN), "up_proj": (INTER, HIDDEN), "down_proj": (HIDDEN, INTER)}
_PROJ_LEAF = re.compile(r"(.*\.(\w+_proj))\.(weight|weight_scale|weight_scale_2|input_scale|k_scale|v_scale)$")


def real_weight_map(name: str) -> dict[str, str]:
    return json.loads((REAL / name / "model.safetensors.index.json").read_text())["weight_map"]


def llama_tensors(names: list[str], seed: int = 0) -> dict[str, torch.Tensor]:
    """A value for every name of a Llama-style NVFP4 export: packed projections, scalar scales, BF16 rest."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {}
    for name in names:
        match = _PROJ_LEAF.match(name)
        if match and match[3] == "weight":
            weight = (torch.randn(PROJ_SHAPES[match[2]], generator=gen) * 0.05).to(torch.bfloat16)
            packed, scale, scale_2 = nvfp4.quantize(weight)
            out.update({f"{match[1]}.weight": packed, f"{match[1]}.weight_scale": scale, f"{match[1]}.weight_scale_2": scale_2})
        elif match and match[3] in ("input_scale", "k_scale", "v_scale"):
            out[name] = torch.tensor(0.01 + torch.rand((), generator=gen).item())
        elif name.endswith("norm.weight"):
            out[name] = torch.ones(HIDDEN, dtype=torch.bfloat16)
        elif not match:
            out[name] = (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.05).to(torch.bfloat16)
    if set(out) != set(names):
        raise ValueError(f"names this builder does not know: {sorted(set(names) ^ set(out))[:5]}")
    return out


def write_llama(folder: Path, real: str, weight_map: dict[str, str]) -> Path:
    """`real`'s quantization config and tensor names, written into the shards `weight_map` assigns, in its order."""
    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    tensors = llama_tensors(list(weight_map))
    for shard in sorted(set(weight_map.values())):
        save_file({n: tensors[n].contiguous() for n in weight_map if weight_map[n] == shard}, folder / shard, metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.copy(REAL / real / "hf_quant_config.json", folder)
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN, "intermediate_size": INTER,
              "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
              "num_hidden_layers": 1 + max(int(m[1]) for n in weight_map if (m := re.match(r"model\.layers\.(\d+)\.", n))),
              "torch_dtype": "bfloat16"}
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder
