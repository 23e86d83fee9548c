"""Built-in example checkpoints: NVFP4 Gemma 4 assistants written with the project's own codec.

`write_assistant` produces what ModelOpt's exporter produces for a Gemma 4 assistant — packed
uint8 weights with fp8 block scales and a float32 global scale, fused gate/up sharing one
`weight_scale_2`, the tied lm_head left out, both config files — at any size, from the tiny
one the demo uses to the real 31B assistant's shapes. `broken=True` reproduces the exporter bug
(pre/post_projection packed too). Tests check this generator against ModelOpt's real export.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.arch import gemma4_assistant
from repair.codec import nvfp4


@dataclass(frozen=True)
class AssistantDims:
    hidden: int
    backbone: int
    intermediate: int
    layers: int
    heads: int
    head_dim: int
    global_head_dim: int
    vocab: int


TINY = AssistantDims(hidden=64, backbone=96, intermediate=128, layers=2, heads=2, head_dim=32, global_head_dim=64, vocab=128)
GEMMA4_31B = AssistantDims(hidden=1024, backbone=5376, intermediate=8192, layers=4, heads=32, head_dim=256, global_head_dim=512, vocab=262144)
FUSED = (("mlp.gate_proj", "mlp.up_proj"),)
EXCLUDED_BY_EXPORTER = ["lm_head"]


def assistant_config(dims: AssistantDims) -> dict:
    """A config.json in the form transformers >= 5.15 writes for Gemma4AssistantForCausalLM."""
    layer_types = ["sliding_attention"] * (dims.layers - 1) + ["full_attention"]
    text = {
        "model_type": "gemma4_text", "hidden_size": dims.hidden, "intermediate_size": dims.intermediate,
        "num_hidden_layers": dims.layers, "num_attention_heads": dims.heads, "num_key_value_heads": 1,
        "head_dim": dims.head_dim, "per_layer_config": {str(dims.layers - 1): {"head_dim": dims.global_head_dim}},
        "layer_types": layer_types, "vocab_size": dims.vocab, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0, "num_kv_shared_layers": dims.layers, "sliding_window": 16,
        "hidden_activation": "gelu_pytorch_tanh", "rms_norm_eps": 1e-06, "attention_k_eq_v": False,
        "enable_moe_block": False, "use_double_wide_mlp": False, "tie_word_embeddings": True,
    }
    return {
        "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
        "backbone_hidden_size": dims.backbone, "use_ordered_embeddings": False, "num_centroids": 2048,
        "centroid_intermediate_top_k": 32, "tie_word_embeddings": True, "dtype": "bfloat16", "text_config": text,
    }


def random_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic BF16 weights for every module the config defines (norms near 1)."""
    gen = torch.Generator().manual_seed(seed)
    weights = {}
    for spec in gemma4_assistant.expected_modules(config).values():
        name = spec.name if spec.role in ("scalar", "buffer") else f"{spec.name}.weight"
        if spec.role in ("norm", "scalar"):
            weights[name] = (1 + 0.1 * torch.randn(spec.shape, generator=gen)).to(torch.bfloat16)
        else:
            weights[name] = (0.05 * torch.randn(spec.shape, generator=gen)).to(torch.bfloat16)
    return weights


def quantize_state(
    weights: dict[str, torch.Tensor], config: dict, keep_bf16: tuple[str, ...], input_scales: bool = True
) -> dict[str, torch.Tensor]:
    """NVFP4-quantize every linear except `keep_bf16`, as ModelOpt's export does (fused siblings share scales).

    `input_scales` adds the activation scales a calibrated export has (activation amax / 2688);
    they cannot be derived from weights, so a deterministic stand-in per layer is used.
    """
    specs = gemma4_assistant.expected_modules(config)
    quantized = {n for n, s in specs.items() if s.is_linear and s.role != "lm_head" and n not in keep_bf16}
    out: dict[str, torch.Tensor] = {}
    for name, tensor in weights.items():
        module = name.removesuffix(".weight")
        if module not in quantized:
            out[name] = tensor
            continue
        packed, scale, scale_2 = nvfp4.quantize(tensor, _shared_scale_2(module, weights))
        out.update({name: packed, f"{module}.weight_scale": scale, f"{module}.weight_scale_2": scale_2})
        if input_scales:
            out[f"{module}.input_scale"] = _input_scale(module)
    return out


def _input_scale(module: str) -> torch.Tensor:
    """A stand-in calibrated activation scale, equal for fused siblings (they read the same input)."""
    shared_input = module.replace("up_proj", "gate_proj")
    amax = 1.0 + (sum(shared_input.encode()) % 97) / 10.0
    return torch.tensor(amax / (nvfp4.E2M1_MAX * nvfp4.E4M3_MAX), dtype=torch.float32)


def _shared_scale_2(module: str, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    for group in FUSED:
        for member in group:
            if module.endswith(member):
                base = module[: -len(member)]
                return torch.stack([nvfp4.global_scale(weights[f"{base}{m}.weight"]) for m in group]).amax()
    return nvfp4.global_scale(weights[f"{module}.weight"])


def quant_configs(exclude: list[str]) -> tuple[dict, dict]:
    """(config.json quantization_config, hf_quant_config.json) as ModelOpt 0.47 writes them."""
    producer = {"name": "modelopt", "version": "0.47.0"}
    fp4 = {"dynamic": False, "num_bits": 4, "type": "float", "group_size": 16}
    qc = {
        "config_groups": {"group_0": {"input_activations": fp4, "weights": fp4, "targets": ["Linear"]}},
        "ignore": list(exclude), "quant_algo": "NVFP4", "producer": producer, "quant_method": "modelopt",
    }
    hf = {"producer": producer, "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": list(exclude)}}
    return qc, hf


def write_assistant(
    out: Path, dims: AssistantDims = TINY, *, broken: bool = True, seed: int = 0, shards: list[list[str]] | None = None,
    weights: dict[str, torch.Tensor] | None = None, input_scales: bool = True, exclusion_prefix: str = "",
) -> Path:
    """Write an NVFP4 assistant checkpoint; `broken` packs pre/post_projection like the buggy export.

    `exclusion_prefix` spells the excluded handshake layers with it (`model.pre_projection`), as an exporter naming
    modules by their wrapped path does: vLLM matches such a name, SGLang 0.5.23 does not (sglang#36596).

    `shards` optionally lists module-name prefixes per extra shard (everything else goes in the
    first); with it the folder gets `model.safetensors.index.json` like a sharded export.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=False)
    config = assistant_config(dims)
    keep = () if broken else gemma4_assistant.BF16_HANDSHAKE
    state = quantize_state(weights if weights is not None else random_weights(config, seed), config, keep, input_scales)
    qc, hf = quant_configs(EXCLUDED_BY_EXPORTER + [exclusion_prefix + name for name in keep])
    _write_json(out / "config.json", {**config, "quantization_config": qc})
    _write_json(out / "hf_quant_config.json", hf)
    _write_json(out / "generation_config.json", {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0})
    _write_shards(out, state, shards)
    return out


def _write_shards(out: Path, state: dict[str, torch.Tensor], shards: list[list[str]] | None) -> None:
    if not shards:
        save_file(state, out / "model.safetensors", metadata={"format": "pt"})
        return
    groups: list[dict[str, torch.Tensor]] = [{} for _ in range(len(shards) + 1)]
    for name, tensor in state.items():
        slot = next((i + 1 for i, prefixes in enumerate(shards) if any(name.startswith(p) for p in prefixes)), 0)
        groups[slot][name] = tensor
    count = len(groups)
    weight_map = {}
    for i, group in enumerate(groups):
        file = f"model-{i + 1:05d}-of-{count:05d}.safetensors"
        save_file(group, out / file, metadata={"format": "pt"})
        weight_map.update({name: file for name in group})
    total = sum(t.numel() * t.element_size() for t in state.values())
    _write_json(out / "model.safetensors.index.json", {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2) + "\n")

