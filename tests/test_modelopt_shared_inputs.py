"""Which modules share one global scale when requantized is ModelOpt's rule (repair/formats/shared_scale.py), asked
of ModelOpt's own export code: the groups its `collect_shared_input_modules` forms on tiny transformers models are the
table's, and its FP8 per-tensor export fuses none (fix --requantize of an FP8 k_proj reproduces ModelOpt's own bytes,
not the q/k/v group's max scale)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.formats.shared_scale import shared_scale_siblings
from tests.conftest import run_captured
from tools import modelopt_export

DEEPSEEK = dict(modelopt_export.TINY_LLAMA, num_key_value_heads=4, n_routed_experts=4, num_experts_per_tok=2,
                moe_intermediate_size=32, n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=32, q_lora_rank=32,
                qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_group=1, topk_group=1)
# a shared expert named in the singular (Qwen2-MoE), an MLP named feed_forward with one (Llama 4's text layers)
QWEN2_MOE = dict(modelopt_export.TINY_LLAMA, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
                 num_experts_per_tok=2)
LLAMA4 = dict(modelopt_export.TINY_LLAMA, head_dim=16, intermediate_size_mlp=128, intermediate_size=32, num_local_experts=4,
              num_experts_per_tok=1, interleave_moe_layer_step=2, no_rope_layers=[1, 1])
MODELS = {"llama": ("LlamaConfig", "LlamaForCausalLM", modelopt_export.TINY_LLAMA),
          "deepseek-v3": ("DeepseekV3Config", "DeepseekV3ForCausalLM", DEEPSEEK),
          "deepseek-v3-no-q-lora": ("DeepseekV3Config", "DeepseekV3ForCausalLM", dict(DEEPSEEK, q_lora_rank=None)),
          "qwen2-moe": ("Qwen2MoeConfig", "Qwen2MoeForCausalLM", QWEN2_MOE),
          "llama4": ("Llama4TextConfig", "Llama4ForCausalLM", LLAMA4)}
# what the groups hold, so a ModelOpt that formed none would not pass: DeepSeek-V3's shared experts and MLA included
EXPECTED = {"llama": {"self_attn.q_proj", "mlp.gate_proj"},
            "deepseek-v3": {"self_attn.q_a_proj", "mlp.gate_proj", "mlp.shared_experts.gate_proj"},
            "deepseek-v3-no-q-lora": {"self_attn.q_proj", "mlp.shared_experts.gate_proj"},
            "qwen2-moe": {"self_attn.q_proj", "mlp.shared_expert.gate_proj"},
            "llama4": {"self_attn.q_proj", "feed_forward.gate_proj", "feed_forward.shared_expert.gate_proj"}}


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
    assert_requantize_reproduces(export, original, f"{attn}.k_proj", tmp_path, capsys, 'algorithm = "FP8"\n')
    report = json.loads((tmp_path / "out" / "repair_report.json").read_text())
    assert [c["module"] for c in report["changes"]] == [f"{attn}.k_proj"]  # q/v keep their bytes: not changed, not listed


def assert_requantize_reproduces(export, original, module: str, tmp_path, capsys, extra: str = "") -> None:
    """Zero `module`'s packed weight in a copy of ModelOpt's export, fix --requantize it from the original: every byte
    ModelOpt wrote comes back, the module's recomputed ones too."""
    theirs = load_file(export / "model.safetensors")
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in export.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    zeroed = dict(theirs, **{f"{module}.weight": torch.zeros_like(theirs[f"{module}.weight"])})
    save_file(zeroed, broken / "model.safetensors", metadata={"format": "pt"})
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "k"\n[[rules]]\naction = "requantize"\nmodules = ["{module}"]\n{extra}')
    code, text, err = run_captured(capsys, "fix", broken, "-o", tmp_path / "out", "--original", original, "--recipe", recipe)
    assert code == 0, text + err
    ours = load_file(tmp_path / "out" / "model.safetensors")
    for name, tensor in theirs.items():
        assert torch.equal(ours[name].reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8)), name


# ModelOpt's export of routed experts: transformers keeps them fused ([E, 2*I, H] gate_up_proj, one weight quantizer per
# expert) and ModelOpt writes each expert's gate/up (w1/w3 for Mixtral) with that one weight_scale_2; its
# sync_moe_gate_up_amax (layer_utils.py _GATE_UP_PAIRS) gives unfused experts' pairs the max of the two amax likewise
MIXTRAL = dict(modelopt_export.TINY_LLAMA, num_local_experts=4, num_experts_per_tok=2)
EXPERTS = {"qwen3-moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", modelopt_export.TINY_QWEN3_MOE,
                         "model.layers.0.mlp.experts.1.{}", ("gate_proj", "up_proj")),
           "mixtral": ("MixtralConfig", "MixtralForCausalLM", MIXTRAL, "model.layers.0.block_sparse_moe.experts.1.{}", ("w1", "w3"))}


@pytest.fixture(scope="module", params=sorted(EXPERTS))
def moe_export(request, tmp_path_factory):
    config_cls, model_cls, dims, path, pair = EXPERTS[request.param]
    root = tmp_path_factory.mktemp(request.param)
    export = modelopt_export.export_tiny_causal_lm(config_cls, model_cls, dims, root / "export")
    original = modelopt_export.save_tiny_causal_lm_original(config_cls, model_cls, dims, root / "original")
    return export, original, [path.format(p) for p in pair]


@pytest.mark.parametrize("which", [0, 1])
def test_requantized_routed_expert_shares_its_pair_scale_as_modelopt_exports(moe_export, which, tmp_path, capsys):
    """fix --requantize of one routed expert's gate (or up) reproduces ModelOpt's export byte for byte: the pair's one
    weight_scale_2, not the module's own (vLLM builds the pair as one w13 with the gate's scale)."""
    export, original, pair = moe_export
    theirs = load_file(export / "model.safetensors")
    scales = [theirs[f"{m}.weight_scale_2"].item() for m in pair]
    assert scales[0] == scales[1], scales  # the premise: ModelOpt gave the pair one scale
    weights = load_file(original / "model.safetensors")
    own = [weights[f"{m}.weight"].float().abs().amax().item() for m in pair]
    assert own[0] != own[1], own  # and their own amax differ, so a module requantized alone would differ
    assert_requantize_reproduces(export, original, pair[which], tmp_path, capsys)
