"""Which modules share one global scale when requantized is ModelOpt's rule (repair/formats/shared_scale.py), asked
of ModelOpt's own export code: the groups its `collect_shared_input_modules` forms on tiny transformers models are the
table's, and its FP8 per-tensor export fuses none (fix --requantize of an FP8 k_proj reproduces ModelOpt's own bytes,
not the q/k/v group's max scale)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.formats.shared_scale import shared_scale_siblings
from tests.conftest import run_captured
from tools import modelopt_export

DEEPSEEK = dict(modelopt_export.TINY_LLAMA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=32,
                qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1)
MODELS = {"llama": ("LlamaConfig", "LlamaForCausalLM", modelopt_export.TINY_LLAMA),
          "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", DEEPSEEK),
          "deepseek-v3-no-q-lora": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(DEEPSEEK, q_lora_rank=None))}
# what the groups hold, so a ModelOpt that formed none would not pass: DeepSeek-V3's shared experts and MLA included
EXPECTED = {"llama": {"self_attn.q_proj", "mlp.gate_proj"},
            "deepseek-v3": {"self_attn.q_a_proj", "mlp.gate_proj", "mlp.shared_experts.gate_proj"},
            "deepseek-v3-no-q-lora": {"self_attn.q_proj", "mlp.shared_experts.gate_proj"}}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_table_is_the_groups_modelopt_fuses(model):
    groups = modelopt_export.shared_input_groups(*MODELS[model])
    firsts = {g[0].split(".", 3)[3] for g in groups}  # model.layers.N.<path>
    assert EXPECTED[model] <= firsts, groups
    names = {n for g in groups for n in g}
    for group in groups:
        for name in group:  # each member's siblings, as the table gives them, are exactly ModelOpt's group
            assert sorted(shared_scale_siblings(name, names, "NVFP4")) == sorted(group), (name, group)


@pytest.fixture(scope="module")
def fp8_llama(tmp_path_factory):
    root = tmp_path_factory.mktemp("fp8")
    return modelopt_export.export_tiny_llama_fp8(root / "export"), modelopt_export.save_tiny_llama_original(root / "original")


def test_modelopt_fp8_export_keeps_each_scale_and_requantize_reproduces_it(fp8_llama, tmp_path, capsys):
    export, original = fp8_llama
    theirs = load_file(export / "model.safetensors")
    attn = "model.layers.0.self_attn"
    scales = {p: theirs[f"{attn}.{p}.weight_scale"].item() for p in ("q_proj", "k_proj", "v_proj")}
    assert len(set(scales.values())) == 3, scales  # the premise: ModelOpt's FP8 export gave q/k/v their own scale
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in export.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    zeroed = dict(theirs, **{f"{attn}.k_proj.weight": torch.zeros_like(theirs[f"{attn}.k_proj.weight"])})
    save_file(zeroed, broken / "model.safetensors", metadata={"format": "pt"})
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "k"\n[[rules]]\naction = "requantize"\nmodules = ["{attn}.k_proj"]\nalgorithm = "FP8"\n')
    code, text, err = run_captured(capsys, "fix", broken, "-o", tmp_path / "out", "--original", original, "--recipe", recipe)
    assert code == 0, text + err
    ours = load_file(tmp_path / "out" / "model.safetensors")
    for name, tensor in theirs.items():  # every byte ModelOpt wrote, k_proj's recomputed ones too
        assert torch.equal(ours[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name
