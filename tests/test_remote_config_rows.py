"""vLLM 0.32 rows of architectures whose config class comes with remote code only, learned from vLLM's own model code
(tools/vllm_remote_configs.py: the fields its class reads, answered from a generic table; the checkpoint names its own
load_weights takes: tools/vllm_saved_names.py own_checkpoint). vLLM's tier judges each row with a tiny export its loader
loads (tests/vllm/test_generated_archs_vs_vllm.py, every shipped row); here, the data against itself and doctor.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from repair import arch
from repair.targets.profiles import release_at_or_below
from tests.conftest import run_captured
from tools import profile_report
from tools.real_fixture import write_real_model

VLLM = arch.newest("vllm")
VLLM28 = release_at_or_below("vllm", (0, 28, 0))
LEARNED = sorted(a for a, e in VLLM.entries.items() if e["config"]["source"].startswith(profile_report.LEARNED))
# vLLM 0.32 registers these under its LlamaForCausalLM class (model_executor/models/registry.py: ("llama",
# "LlamaForCausalLM")); transformers writes Llama's config, so that row is learned from transformers' own names
LLAMA_ALIASES = ("IQuestCoderForCausalLM", "InternLM3ForCausalLM", "LLaMAForCausalLM", "TeleChat3ForCausalLM")


def test_rows_are_learned_for_remote_code_architectures():
    assert {"InternLM2ForCausalLM", "OrionForCausalLM", *LLAMA_ALIASES} <= set(LEARNED), LEARNED
    for name in LEARNED:
        source = VLLM.entries[name]["config"]["source"]
        assert "it read " in source and "hidden_size" in source, (name, source)


@pytest.mark.parametrize("name", LLAMA_ALIASES)
def test_a_learned_row_of_llamas_class_is_the_row_learned_from_transformers(name):
    """The same vLLM class learned two ways (a config read off vLLM's code and vLLM's own names with fused layers as
    their shards, against transformers' LlamaConfig and transformers' own checkpoint) gives the same facts."""
    learned = {k: v for k, v in VLLM.entries[name].items() if k != "config"}
    assert learned == {k: v for k, v in VLLM.entries["LlamaForCausalLM"].items() if k != "config"}


def test_internlm2_row_names_its_checkpoint_shards():
    """InternLM2's checkpoints store feed_forward.w1 / w3, which vLLM stacks into gate_up_proj (internlm2.py's
    hf_to_vllm_mapper orig_to_new_stacked), and attention.wqkv as one tensor."""
    entry = VLLM.entries["InternLM2ForCausalLM"]
    assert entry["fused"] == {"gate_up_proj": ["w1", "w3"]}
    assert entry["renames"]["model.layers.*.feed_forward.w1"] == "model.layers.*.feed_forward.gate_up_proj"
    assert entry["modules"]["model.layers.*.attention.wqkv"]["state"] == "quantized"


@pytest.fixture(scope="module")
def llama_layout(tmp_path_factory):
    return write_real_model(tmp_path_factory.mktemp("learned") / "qwen3", "qwen3-32b")


@pytest.mark.parametrize("name", ["LLaMAForCausalLM", "DeciLMForCausalLM"])
def test_doctor_says_whether_a_learned_row_covers_the_model(capsys, llama_layout, tmp_path, name):
    """A Llama-layout export listed under a learned class is checked with its row; one still unprofiled is named."""
    out_dir = tmp_path / "m"
    shutil.copytree(llama_layout, out_dir)
    config = json.loads((llama_layout / "config.json").read_text())
    (out_dir / "config.json").write_text(json.dumps(dict(config, architectures=[name])))
    code, out, err = run_captured(capsys, "doctor", out_dir, "--target", "vllm==0.32.0")
    first = out.splitlines()[0]
    assert (f"cover {name}" in first) == (name not in LEARNED), first


def test_orion_row_is_learned_from_its_published_shards():
    """Published Orion checkpoints store q_proj / k_proj / v_proj and gate_proj / up_proj (OrionStarAI's
    modeling_orion.py; vLLM's orion.py hf_to_vllm_mapper stacks them: orig_to_new_stacked), never qkv_proj whole."""
    assert VLLM.entries["OrionForCausalLM"]["renames"]["model.layers.*.self_attn.q_proj"] == "model.layers.*.self_attn.qkv_proj"


def _attention_excluded(src, dst, arch):
    """`src` (a Llama-layout NVFP4 export) with layer 0's q/k/v stored BF16 and listed in exclude_modules."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    for proj in ("q_proj", "k_proj", "v_proj"):
        module = f"model.layers.0.self_attn.{proj}"
        rows = tensors[f"{module}.weight"].shape[0]
        for leaf in [n for n in tensors if n.startswith(module + ".")]:
            tensors.pop(leaf)
        tensors[f"{module}.weight"] = torch.zeros(rows, 64, dtype=torch.bfloat16)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    quant = json.loads((dst / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] += [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    (dst / "hf_quant_config.json").write_text(json.dumps(quant))
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(dict(config, architectures=[arch])))
    return dst


def test_orion_export_with_attention_excluded_is_not_called_healthy(capsys, llama_layout, tmp_path):
    """vLLM 0.32's orion.py has no packed_modules_mapping: it asks its quant config about qkv_proj alone, so excluding
    q/k/v reaches nothing, qkv_proj is built NVFP4 and the BF16 q_proj fails its weight loader (measured with
    tools/vllm_load.py: AssertionError; the same export as LlamaForCausalLM loads, and the Orion one loads once
    `...self_attn.qkv_proj` is excluded too). Doctor must not call it healthy, and must take that entry as used."""
    orion = _attention_excluded(llama_layout, tmp_path / "orion", "OrionForCausalLM")
    llama = _attention_excluded(llama_layout, tmp_path / "llama", "LlamaForCausalLM")
    code, out, _ = run_captured(capsys, "doctor", llama, "--target", "vllm==0.32.0")
    assert code == 0 and "0 error(s), 0 warning(s)" in out.splitlines()[0], out
    code, out, _ = run_captured(capsys, "doctor", orion, "--target", "vllm==0.32.0")
    assert "0 error(s), 0 warning(s)" not in out.splitlines()[0], out
    assert code == 1 and "error: [config-contradiction] model.layers.0.self_attn.q_proj: stored bf16, but vllm==0.32.0 " \
        "builds it nvfp4" in out and "exclude 'model.layers.0.self_attn.qkv_proj', the name the runtime matches" in out, out
    quant = json.loads((orion / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"].append("model.layers.0.self_attn.qkv_proj")
    (orion / "hf_quant_config.json").write_text(json.dumps(quant))
    code, out, _ = run_captured(capsys, "doctor", orion, "--target", "vllm==0.32.0")
    assert code == 0 and "0 error(s), 0 warning(s)" in out.splitlines()[0] and "unused-exclusion" not in out, out


def _restored(src, dst, arch, edit, **config):
    """`src` copied to `dst` with its tensors edited (`edit(tensors)` returns the new ones) and config.json updated."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = edit({k: v for k, v in load_file(dst / "model.safetensors").items() if not k.endswith(("q_norm.weight", "k_norm.weight"))})
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    old = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(dict(old, architectures=[arch], **config)))
    return dst


def mimo_with_mtp(src, dst):
    """`src` (a Llama-layout NVFP4 export) as MiMo-7B stores it: q/k/v biases, and an MTP block under
    model.mtp_layers.0.* (layer 0's tensors), its q_proj BF16 and listed in no exclusion."""
    import torch

    def edit(tensors):
        out = dict(tensors)
        for name, value in tensors.items():
            if name.startswith("model.layers.0.") and ".q_proj." not in name:
                out[name.replace("model.layers.0.", "model.mtp_layers.0.")] = value.clone()
        out["model.mtp_layers.0.self_attn.q_proj.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)
        for layer in (0, 1):
            for proj, rows in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32)):
                out[f"model.layers.{layer}.self_attn.{proj}.bias"] = torch.zeros(rows, dtype=torch.bfloat16)
        return out

    return _restored(src, dst, "MiMoForCausalLM", edit, num_nextn_predict_layers=1)


def test_mimo_mtp_layers_vllm_drops_are_not_errors(capsys, llama_layout, tmp_path):
    """Published MiMo-7B checkpoints store an MTP block under model.mtp_layers.0.*, which vLLM 0.32's MiMoForCausalLM
    drops unread (mimo.py:93: hf_to_vllm_mapper orig_to_new_prefix {"model.mtp_layers.": None}; the row's renames
    record that prefix, generated from the mapper). Measured (tools/vllm_load.py): this export, its MTP q_proj BF16
    and not excluded, loads in vLLM 0.32. Doctor checks nothing under it and says so in one note."""
    assert VLLM.entries["MiMoForCausalLM"]["renames"] == {"model.mtp_layers.": None}
    mimo = mimo_with_mtp(llama_layout, tmp_path / "mimo")
    code, out, _ = run_captured(capsys, "doctor", mimo, "--target", "vllm==0.32.0")
    assert code == 0 and "0 error(s)" in out.splitlines()[0], out
    assert "drops every tensor under model.mtp_layers. unread (its weight mapper" in out and "mtp_layers.0.self_attn.q_proj:" not in out, out


def test_mimo_mtp_layers_vllm_028_drops_are_not_errors(capsys, llama_layout, tmp_path):
    """vLLM 0.28's MiMoForCausalLM drops model.mtp_layers. through its load_weights' AutoWeightsLoader skip_prefixes
    (mimo.py:121-125), not a mapper: the row records it (tools/vllm_dropped.py loader_drops; it had recorded mapper
    drops only, and doctor called the MTP q_proj a fused-shards error). Measured: 0.28's own loader loads this export
    (tools/vllm_load.py)."""
    assert VLLM28.entries["MiMoForCausalLM"]["renames"].get("model.mtp_layers.", "absent") is None
    mimo = mimo_with_mtp(llama_layout, tmp_path / "mimo")
    code, out, _ = run_captured(capsys, "doctor", mimo, "--target", "vllm==0.28.0")
    assert code == 0 and "0 error(s)" in out.splitlines()[0], out


def minicpm_moe(src, dst):
    """`src` (a Llama-layout NVFP4 export) as MiniCPM-MoE-8x2B stores it: num_experts 2, each MLP's gate/up/down as every
    expert's w1/w3/w2 (NVFP4), and a BF16 router `mlp.gate` listed in no exclusion."""
    import torch

    def edit(tensors):
        out = {}
        for name, value in tensors.items():
            shard = next((s for s in ("gate_proj", "up_proj", "down_proj") if f".mlp.{s}." in name), None)
            for expert in (0, 1) if shard else ():
                w = {"gate_proj": "w1", "up_proj": "w3", "down_proj": "w2"}[shard]
                out[name.replace(f".mlp.{shard}.", f".mlp.experts.{expert}.{w}.")] = value.clone()
            if not shard:
                out[name] = value
        for layer in (0, 1):
            out[f"model.layers.{layer}.mlp.gate.weight"] = torch.zeros(2, 64, dtype=torch.bfloat16)
        return out

    return _restored(src, dst, "MiniCPMForCausalLM", edit, num_experts=2, num_experts_per_tok=1)


def test_minicpm_moe_router_is_not_called_built_nvfp4(capsys, llama_layout, tmp_path):
    """MiniCPM-MoE-8x2B's config says num_experts: 8 under MiniCPMForCausalLM; vLLM 0.32's MiniCPMMoE builds its
    router `mlp.gate` unquantized (GateLinear, no quant_config, minicpm.py:115-120), so a BF16 router is no error. The
    row is learned on the dense branch (num_experts read with default 0, minicpm.py:353); the MoE build is its
    `variants` entry (tools/vllm_variants.py: built again with num_experts 2 and 4, the same layers), which holds for
    a config setting num_experts to an int other than 0. It had got the generic row, which knows no router."""
    moe = minicpm_moe(llama_layout, tmp_path / "moe")
    code, out, _ = run_captured(capsys, "doctor", moe, "--target", "vllm==0.32.0")
    assert "mlp.gate: stored bf16, but vllm==0.32.0 builds it nvfp4" not in out, out
    assert "its layer roles and fused layers are vllm 0.32.0's own (generated profile)" in out, out
    from repair.arch import architecture

    config = json.loads((moe / "config.json").read_text())
    row = architecture(config)
    assert not row.not_covered and "model.layers.*.mlp.gate" in row.built_quantized.entry["modules"], row.name
    assert "model.layers.*.mlp.gate_up_proj" not in row.built_quantized.entry["modules"]


def test_learned_rows_record_every_defaulted_read_with_the_value_used():
    """getattr(config, "num_experts", 0) picks MiniCPM's dense MLP silently: each learned row's config.source lists the
    fields vLLM's model code read with a default and the value it used, and `agrees_with` holds those whose other value
    builds other layers (tools/vllm_remote_configs.py deciding_default)."""
    minicpm = VLLM.entries["MiniCPMForCausalLM"]["config"]
    assert "num_experts=0 (minicpm.py:" in minicpm["source"] and minicpm["agrees_with"] == {"num_experts": 0}, minicpm
    exaone = VLLM.entries["ExaoneForCausalLM"]["config"]["source"]
    assert "attention_bias=False (exaone.py:" in exaone and "mlp_bias=False (exaone.py:" in exaone, exaone
    assert "moe_router_enable_expert_bias=False" in VLLM.entries["BailingMoeV2_5ForCausalLM"]["config"]["source"]


def test_a_config_of_another_branch_gets_the_generic_row_and_doctor_says_why(capsys, llama_layout, tmp_path):
    """DeepseekForCausalLM's row is learned with moe_layer_freq read with default 1 (deepseek.py); a config.json with
    moe_layer_freq: 2 is another build, no variant of which the profile records, so the row does not apply: generic
    roles, and doctor's line names the field and both values. The same config with moe_layer_freq: 1 written out is
    the row's own build. (MiniCPM's num_experts, which had been this case, now has its MoE build recorded: above.)"""
    from repair.arch import architecture

    config = json.loads((llama_layout / "config.json").read_text())
    other = dict(config, architectures=["DeepseekForCausalLM"], moe_layer_freq=2)
    assert architecture(other).not_covered and architecture(dict(other, moe_layer_freq=1)).name.startswith("DeepseekForCausalLM")
    assert architecture(dict(config, architectures=["MiniCPMForCausalLM"], num_experts="2")).not_covered  # no int: no variant
    out_dir = tmp_path / "m"
    shutil.copytree(llama_layout, out_dir)
    (out_dir / "config.json").write_text(json.dumps(other))
    code, out, _ = run_captured(capsys, "doctor", out_dir, "--target", "vllm==0.32.0")
    assert "does not cover this config (its row was learned where vLLM's model code read moe_layer_freq = 1 by default, " \
        "which chose the layers it builds; config.json sets moe_layer_freq = 2), so generic layer roles were used" in out, out


@pytest.mark.parametrize("name, module, asked", [
    ("StableLmForCausalLM", "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.qkv_proj"),
    ("OrionForCausalLM", "model.layers.0.self_attn.k_proj", "model.layers.0.self_attn.qkv_proj"),
    # vLLM 0.32 loads q/k/v_conv1d into one conv1d it builds with no quant method: it asks its quant config nothing about
    # conv1d, so a shard's own exclusion is what inspect reads (the vLLM tier's inspect-vs-vLLM on OlmoHybrid found it)
    ("OlmoHybridForCausalLM", "model.layers.0.linear_attn.q_conv1d", "model.layers.0.linear_attn.q_conv1d"),
])
def test_a_merged_layer_is_asked_by_its_own_name_only_where_the_release_asks_its_quant_config(name, module, asked):
    row = arch.architecture({"architectures": [name]}, VLLM)
    assert row.asked_as(module) == asked


def test_mistral_large_3_row_is_learned_from_the_names_its_mapper_renames():
    """mistral_large_3.py's hf_to_vllm_mapper renames Mistral's consolidated names (`layers.N.attention.wo`, `output`,
    `tok_embeddings`) with anchored regexes: the row is learned from vLLM's names sent back through it
    (tools/vllm_mapper_inverse.py), each proven by mapping it forward again. vLLM maps an exclusion entry as itself, and
    `\\Aoutput\\.weight\\Z` never matches the entry `output`: the layer is asked as `lm_head` (prefixes), and Mistral's
    `tok_embeddings` is vLLM's unquantized embedding."""
    entry = VLLM.entries["MistralLarge3ForCausalLM"]
    assert entry["renames"]["layers.*.attention.wo"] == "model.layers.*.self_attn.o_proj"
    assert entry["renames"]["layers.*.experts.*.w1"] == "model.layers.*.mlp.experts.*.gate_proj"
    assert entry["renames"]["output"] == "lm_head" and entry["renames"]["tok_embeddings"] == "model.embed_tokens"
    assert entry["prefixes"]["output"] == "lm_head"
    row = arch.profiled.generated_row(VLLM, "MistralLarge3ForCausalLM", entry)
    assert any(re.search(r.pattern, "tok_embeddings") for r in row.unquantized_roles)


def test_mistral_large_3_row_is_the_mla_build_of_mistrals_own_params():
    """Mistral Large 3 is published in Mistral's own format (params.json); vLLM reads it with its own adapter
    (transformers_utils/configs/mistral.py adapt_config_dict: model_type deepseek_v3, qk_nope_head_dim set), so
    deepseek_v2.py:1289 builds MLA attention (`q_a_proj`, `kv_a_proj_with_mqa`, `kv_b_proj`), the layers
    mistral_large_3.py's regexes name (`wq_a`, `wkv_a_with_mqa`, `wkv_b`). A config read with vLLM's defaults
    (qk_nope_head_dim = qk_rope_head_dim = 0) builds DeepseekAttention's qkv_proj instead: no published layout."""
    entry = VLLM.entries["MistralLarge3ForCausalLM"]
    assert "model.layers.*.self_attn.qkv_proj" not in entry["modules"], sorted(entry["modules"])
    assert entry["renames"]["layers.*.attention.wq_a"] == "model.layers.*.self_attn.q_a_proj"
    assert entry["renames"]["layers.*.attention.wkv_a_with_mqa"] == "model.layers.*.self_attn.kv_a_proj_with_mqa"
    assert entry["renames"]["layers.*.attention.wkv_b"] == "model.layers.*.self_attn.kv_b_proj"
    assert entry["prefixes"].get("layers.*.attention.wo") != "", entry["prefixes"]
    assert "agrees_with" not in entry["config"], entry["config"]


@pytest.mark.parametrize("command", ["doctor", "fix", "inspect"])
def test_mistrals_own_format_is_refused_in_one_line(capsys, tmp_path, command):
    """Mistral Large 3 is published as params.json + consolidated-*.safetensors, no config.json; vLLM 0.32 reads it
    with its Mistral reader (transformers_utils/config.py: consolidated*.safetensors beside params.json -> config_format
    mistral). We read no params.json: doctor said "config.json lists no architectures ... the runtime would stop at
    ValueError: No model architectures are specified", which vLLM does not do. One line, exit 2, nothing written."""
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "ml3"
    src.mkdir()
    save_file({"layers.0.attention.wo.weight": torch.zeros(8, 8, dtype=torch.bfloat16)},
              str(src / "consolidated-00001-of-00001.safetensors"))
    (src / "params.json").write_text(json.dumps({"dim": 8, "n_layers": 1, "moe": {"num_shared_experts": 1}}))
    args = [command, src, "--target", "vllm==0.32.0"] + (["-o", tmp_path / "out"] if command == "fix" else [])
    code, out, err = run_captured(capsys, *(args if command != "inspect" else [command, src]))
    assert code == 2, (out, err)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert len(lines) == 1 and "params.json" in lines[0] and "config.json" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_step3p5_row_is_learned_from_its_published_share_expert_names():
    """step3p5.py's mapper renames `.share_expert.` to `.moe.share_expert.`: the row names the published modules."""
    renames = VLLM.entries["Step3p5ForCausalLM"]["renames"]
    assert renames["model.layers.*.share_expert.gate_proj"] == "model.layers.*.moe.share_expert.gate_proj"


def test_exaone_shards_are_asked_under_model():
    """exaone.py builds its layers under the prefix `model` (exaone.py:401-403); a fused layer's shard is asked as
    `model.h.N...q_proj` (quant_utils.py is_layer_skipped), which no entry naming `transformer.h.N...` reaches."""
    prefixes = VLLM.entries["ExaoneForCausalLM"]["prefixes"]
    assert prefixes["transformer.h.*.attn.attention.q_proj"] == "model.h.*.attn.attention.q_proj"
    assert prefixes["transformer.h.*.mlp.c_fc_1"] == "model.h.*.mlp.c_fc_1"
