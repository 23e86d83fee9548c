"""doctor --target sglang==0.5.23 applies SGLang's own layer names, not vLLM's profile prefixes: checked against SGLang (#28).

vLLM 0.32 builds Afmoe's lm_head with the prefix "" (no exclusion entry reaches it: vLLM builds it NVFP4); SGLang
0.5.23's afmoe.py asks its quant config about `lm_head`, so the exported `lm_head` exclusion holds and SGLang builds
it unquantized and loads the export. The export: the shape of tools/vllm_arch_check.py's healthy Afmoe export (its
config.json, from tools/vllm_profile_configs.py's small config), an NVFP4 o_proj per layer and a BF16 lm_head.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from repair.codec import nvfp4

from .probe import TARGET, load_in_sglang, repair_json, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
CONFIG = {"architectures": ["AfmoeForCausalLM"], "model_type": "afmoe", "vocab_size": 256, "hidden_size": 64,
          "intermediate_size": 128, "moe_intermediate_size": 32, "num_hidden_layers": 3, "num_dense_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "hidden_act": "silu",
          "max_position_embeddings": 512, "rms_norm_eps": 1e-05, "tie_word_embeddings": False,
          "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "num_experts": 4, "num_experts_per_tok": 2,
          "num_shared_experts": 2, "route_scale": 1.0, "global_attn_every_n_layers": 4, "sliding_window": 64,
          "layer_types": ["sliding_attention", "sliding_attention", "full_attention"], "mup_enabled": False,
          "attention_bias": False, "score_func": "sigmoid", "route_norm": True, "n_group": 1, "topk_group": 1,
          "torch_dtype": "bfloat16"}


def afmoe_export(root: Path) -> Path:
    gen = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(256, 64, generator=gen).to(torch.bfloat16),
               "lm_head.weight": torch.randn(256, 64, generator=gen).to(torch.bfloat16)}
    for layer in range(CONFIG["num_hidden_layers"]):  # every decoder layer stored (doctor: no missing layer)
        name = f"model.layers.{layer}.self_attn.o_proj"
        weight = (torch.randn(64, 64, generator=gen) * 0.05).to(torch.bfloat16)
        packed, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(weight))
        tensors.update({f"{name}.weight": packed, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
                        f"{name}.input_scale": torch.tensor(0.01)})
    root.mkdir(parents=True)
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps(CONFIG))
    (root / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.33.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": ["lm_head"]}}))
    return root


def test_afmoe_lm_head_exclusion_holds_in_sglang_as_doctor_says(tmp_path):
    folder = afmoe_export(tmp_path / "afmoe")
    seen = load_in_sglang([folder])[folder]
    assert seen["ok"], seen.get("error")
    assert seen["layers"]["lm_head"]["asked"] == "lm_head", seen["layers"]["lm_head"]
    assert seen["layers"]["lm_head"]["method"] == "UnquantizedLinearMethod", seen["layers"]["lm_head"]
    code, report = repair_json("doctor", folder, "--target", TARGET)
    assert code == 0 and report["schemes"]["lm_head"] == "bf16", report
    assert repair_json("doctor", folder, "--target", "vllm==0.32.0")[0] == 1  # vLLM's prefix '': built NVFP4
