"""A real consumer: repaired checkpoints load in transformers' Gemma4AssistantForCausalLM and compute
exactly what ModelOpt's own dequantization of the broken checkpoint computes."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, Gemma4AssistantForCausalLM

from repair.cli import main
from tests.conftest import load_tensors
from tools.modelopt_export import assistant_inputs, modelopt_dequantize


def reference_model(broken) -> Gemma4AssistantForCausalLM:
    """The broken export with every packed tensor dequantized by ModelOpt itself."""
    config = AutoConfig.from_pretrained(broken, attn_implementation="eager")
    del config.quantization_config
    model = Gemma4AssistantForCausalLM._from_config(config, dtype=torch.bfloat16).eval()  # buffers as from_pretrained makes them
    src = load_tensors(broken)
    state = {}
    for name, tensor in src.items():
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and f"{module}.weight_scale" in src:
            state[name] = modelopt_dequantize(tensor, src[f"{module}.weight_scale"], src[f"{module}.weight_scale_2"])
        elif leaf == "weight" or "scale" not in leaf:
            state[name] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    model.tie_weights()
    return model


@pytest.mark.parametrize("target", ["bf16", "vllm==0.22.1"])
def test_fixed_checkpoint_loads_and_matches_modelopt_dequantized_forward(broken_export, tmp_path, target):
    out = tmp_path / "fixed"
    with pytest.raises(SystemExit) as done:
        main(["fix", str(broken_export), "-o", str(out), "--target", target, "--quiet"])
        raise SystemExit(0)
    assert done.value.code == 0
    model, info = Gemma4AssistantForCausalLM.from_pretrained(out, output_loading_info=True, dtype=torch.bfloat16, attn_implementation="eager")
    assert not info["missing_keys"], info
    assert not info["unexpected_keys"] and not info["mismatched_keys"], info
    model.eval()
    reference = reference_model(broken_export)
    for seed in range(3):
        inputs = assistant_inputs(model, torch.Generator().manual_seed(100 + seed))
        with torch.no_grad():
            got, want = model(**inputs), reference(**inputs)
        assert torch.equal(got.logits, want.logits)
        assert torch.equal(got.last_hidden_state, want.last_hidden_state)
        assert got.last_hidden_state.shape[-1] == model.config.backbone_hidden_size
