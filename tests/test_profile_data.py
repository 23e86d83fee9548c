"""The shipped runtime profiles (repair/targets/data/*.json) are what the rows, --target and the docs use.

The data's truth is checked against vLLM itself in the vLLM tier (tests/vllm/test_profiles_vs_vllm.py regenerates
it); here: every profiled architecture gets its generated row, `--target vllm==X` takes the newest release at or
below X and says which, and docs/runtime_profiles.md is the report of exactly this data.
"""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from repair import arch
from repair.arch.profiled import NEVER_QUANTIZED, module_state
from repair.targets import profiles
from tests.conftest import run_captured
from tools import profile_report

VLLM = arch.newest("vllm")


def test_docs_report_is_regenerated_with_the_data():
    assert profile_report.DOC.read_text() == profile_report.render(), "run: python -m tools.profile_report"


def test_coverage_numbers_are_the_datas():
    text = profile_report.DOC.read_text()
    assert f"profiled: **{len(VLLM.entries)} of {len(VLLM.entries) + len(VLLM.unprofiled)}**" in text
    assert set(VLLM.entries).isdisjoint(VLLM.unprofiled) and all(VLLM.unprofiled.values())


@pytest.mark.parametrize("name", sorted(VLLM.entries))
def test_every_profiled_architecture_gets_its_generated_row(name):
    entry = VLLM.entries[name]  # its config: the profiled build's, with the fields a `without` build lacks set
    row = arch.architecture({"architectures": [name], **dict.fromkeys(entry.get("without", {}).get("fields", ()), 1)})
    if row in arch.ARCHITECTURES:
        pytest.skip(f"{name}: a hand row ({row.name}) keeps knowledge no profile records")
    assert row.fused_layers == {k: tuple(v) for k, v in entry["fused"].items()}
    again = {"architectures": [name], **dict.fromkeys(entry.get("without", {}).get("fields", ()), 1)}
    assert arch.architecture(again) == row  # a row is a value: the same facts compare equal (every field is data)
    never = [p for p, m in entry["modules"].items() if m["state"] in NEVER_QUANTIZED]
    for pattern in never:
        module = pattern.replace("*", "3")
        assert any(re.search(role.pattern, module) for role in row.unquantized_roles), (name, pattern)
        assert module_state(entry, module) in NEVER_QUANTIZED


def fake(label: str):
    return replace(VLLM, release=tuple(int(p) for p in label.split(".")))


@pytest.mark.parametrize("asked,used,older", [("0.30.0", "0.28.0", False), ("0.24.1", "0.24.0", False),
                                              ("0.33", "0.32.0", False), ("0.32.0", "0.32.0", False),
                                              ("0.22.0", "0.24.0", True)])
def test_target_takes_the_newest_release_at_or_below(monkeypatch, asked, used, older):
    monkeypatch.setattr(arch, "PROFILES", tuple(fake(v) for v in ("0.24.0", "0.28.0", "0.32.0")))
    target = profiles.resolve(f"vllm=={asked}")
    assert target.release.label == f"vllm {used}"
    assert target.label.endswith(f"layer rows from the vllm {used} profile" + (
        " (none ships at or below this release: the oldest one)" if older else ""))


def test_doctor_says_which_profile_it_used(tmp_path, capsys, correct_export):
    code, out, _ = run_captured(capsys, "doctor", "--target", "vllm==0.40.0", correct_export)
    assert f"layer rows from the {VLLM.label} profile" in out.splitlines()[0]


@pytest.mark.parametrize("asked,used", [("0.28.5", "0.28"), ("0.29.0", "0.28"), ("0.30.0", "0.30"), ("0.31.9", "0.30"),
                                        ("0.32.0", "0.32"), ("0.35.0", "0.32")])
def test_shipped_releases_give_their_own_rows(asked, used):
    """GLM-4.x's router is a plain unquantized layer in 0.28 and GateLinear later: the row cites the release used."""
    target = profiles.resolve(f"vllm=={asked}")
    assert target.release.source == f"vllm-{used}.json"
    row = arch.architecture({"architectures": ["Glm4MoeForCausalLM"]}, target.release)
    role = row.unquantized_role("model.layers.1.mlp.gate", type("D", (), {"format": type("F", (), {"NAME": "modelopt-nvfp4"}),
                                                                        "quant_algo": "NVFP4"})())
    assert role is not None and f"vllm-{used}.json" in role.why


def test_doctor_says_whether_the_profile_covered_the_architecture(tmp_path, capsys):
    from tools.layout_fixture import write_layout
    from tools.real_fixture import write_real_model

    covered = write_real_model(tmp_path / "qwen3", "qwen3-32b")
    draft = write_layout(tmp_path / "draft", "modelopt-eagle3-draft")
    out = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", covered)[1]
    assert "its layer roles and fused layers are vllm 0.32.0's own (generated profile)" in out
    # a generated layer profile is not a loader profile, and doctor never says it has no profile where it has one
    assert "no loader profile" not in out and ("checked: format health, config consistency and exclusions for "
                                               "Qwen3ForCausalLM (no loader simulation for it)") in out
    out = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", draft)[1]
    assert "no loader profile for LlamaForCausalLMEagle3: checked format health" in out
    assert ("vllm 0.32.0's generated profile does not cover it (not among its registered text-generation or "
            "multimodal generation architectures), so generic layer roles were used") in out


@pytest.mark.parametrize("name,checkpoint,fmt,never", [
    # DeepSeekMTP builds eh_proj as a plain nn.Linear: no quant method under any format (models/deepseek_mtp.py)
    ("DeepseekV3ForCausalLM", "model.layers.61.eh_proj", "compressed-tensors", True),
    ("Glm4MoeForCausalLM", "model.layers.92.eh_proj", "modelopt-nvfp4", True),
    # Qwen3.5 / Qwen3-Next's drafter loads `mtp.fc` into model.fc and forces it unquantized for modelopt_fp4 only
    ("Qwen3_5ForCausalLM", "mtp.fc", "modelopt-nvfp4", True), ("Qwen3NextForCausalLM", "mtp.fc", "modelopt-nvfp4", True),
    ("Qwen3_5MoeForCausalLM", "mtp.fc", "compressed-tensors", False),
    ("Qwen3_5ForCausalLM", "mtp.layers.0.mlp.down_proj", "modelopt-nvfp4", False),
])
def test_mtp_drafter_layers_come_from_the_profile(name, checkpoint, fmt, never):
    """The drafter vLLM builds for speculative_config method "mtp" is profiled with its model (issue 26.3): its
    never-quantized layers are roles of the generated row, on the checkpoint's names (no hand row)."""
    entry = VLLM.entries[name]
    assert entry["mtp"]["modules"], entry["mtp"]
    row = arch.architecture({"architectures": [name]})
    assert row not in arch.ARCHITECTURES, row.name
    covered = [r for r in row.unquantized_roles if r.covers(checkpoint, fmt, "NVFP4" if "nvfp4" in fmt else None)]
    assert bool(covered) == never, [r.name for r in covered]
    if fmt == "modelopt-nvfp4":  # what the profile's own (NVFP4) build recorded
        assert (module_state(entry, checkpoint) in NEVER_QUANTIZED) == never


@pytest.mark.parametrize("name,checkpoint,never", [
    # hy_v3.py's load_weights puts the checkpoint's `mlp.router.gate` into its GateLinear `mlp.gate` (no quant config)
    ("HYV3ForCausalLM", "model.layers.2.mlp.router.gate", True),
    # gemma3n.py loads the top-level embeddings into `model.self_decoder.*` (VocabParallelEmbedding), the AltUp
    # projections into quantized linears there
    ("Gemma3nForCausalLM", "model.embed_tokens_per_layer", True),
    ("Gemma3nForCausalLM", "model.altup_projections.0", False),
])
def test_modules_load_weights_renames_in_code_come_from_the_profile(name, checkpoint, never):
    """Where a class's load_weights (not its weight mapper) puts a checkpoint module into a layer of another name, the
    profile records it (`loads_into`, from vLLM's own load_weights) and the row's roles follow that layer."""
    entry = VLLM.entries[name]
    assert entry["loads_into"], entry
    row = arch.architecture({"architectures": [name]})
    covered = [r for r in row.unquantized_roles if r.covers(checkpoint, "modelopt-nvfp4", "NVFP4")]
    assert bool(covered) == never, [r.name for r in covered]
    assert (module_state(entry, checkpoint) in NEVER_QUANTIZED) == never


@pytest.mark.parametrize("name,refused,loads", [
    # bloom.py's load_weights reshapes every query_key_value tensor to (heads, 3, -1), a 0-d weight_scale_2 too
    ("BloomForCausalLM", "transformer.h.3.self_attention.query_key_value", "transformer.h.3.self_attention.dense"),
    # zamba2.py's mapper renames the adapters' `.0.weight` (so `.0.weight_scale`) but not `.0.input_scale`
    ("Zamba2ForCausalLM", "model.layers.2.shared_transformer.feed_forward.gate_up_proj_adapter_list.0.0",
     "model.layers.2.shared_transformer.feed_forward.down_proj"),
])
def test_nvfp4_leaves_vllms_load_weights_refuses_come_from_the_profile(name, refused, loads):
    """The profile feeds ModelOpt's NVFP4 leaves of each quantized module through the class's own load_weights and
    records the modules it fails on, with its error; the row carries them for doctor."""
    row = arch.architecture({"architectures": [name]})
    hits = [why for pattern, why in row.nvfp4_load_refused if re.search(pattern, refused)]
    assert hits and VLLM.entries[name]["nvfp4_load_refused"][re.sub(r"\.\d+(?=\.|$)", ".*", refused)] in hits[0]
    assert not [why for pattern, why in row.nvfp4_load_refused if re.search(pattern, loads)]


ADAPTER = "model.layers.{}.shared_transformer.feed_forward.gate_up_proj_adapter_list.{}.{}"


def test_prefixes_carry_over_only_the_numbers_taken_from_the_checkpoint_name():
    """tools/vllm_load_facts.py records, per checkpoint name pattern, the prefix vLLM asks: Zamba2's adapters `.0`/`.1`
    (nn.Sequential children: which layer, not which repeat) become A and B, and the prefix takes the adapter index,
    not the layer number; FalconH1's `model.{num_hidden_layers + i}.mixer` and Zamba2's `3.linear` (hybrid count +
    layer) hold numbers no checkpoint number gives, so they are left out rather than filled with the wrong layer."""
    from tools.vllm_load_facts import by_pattern, carried

    asked = {ADAPTER.format(layer, i, ab): f"model.feed_forward.gate_up_proj_adapter_list.{i}.{'AB'[ab]}"
             for layer, i in ((2, 0), (5, 1)) for ab in (0, 1)}
    asked |= {f"model.layers.{n}.mamba.in_proj": f"model.{2 + n}.mixer.in_proj" for n in range(2)}
    asked |= {"model.layers.2.linear": "3.linear", "model.layers.0.mlp.experts.gate_up_proj": "model.layers.0.mlp.experts"}
    got = by_pattern(asked, lambda name, kept: carried(name, asked[name], kept))
    assert got == {ADAPTER.format("*", "*", 0): "model.feed_forward.gate_up_proj_adapter_list.{1}.A",
                   ADAPTER.format("*", "*", 1): "model.feed_forward.gate_up_proj_adapter_list.{1}.B",
                   "model.layers.*.mlp.experts.gate_up_proj": "model.layers.*.mlp.experts"}, got


@pytest.mark.parametrize("layer,adapter", [(2, 0), (9, 4)])
def test_zamba2_adapters_are_asked_under_the_shared_blocks_prefix(layer, adapter):
    """The shipped 0.32 row: what doctor matches exclusions against (runtime_name) and what fix writes (exclusion_name)
    for Zamba2's adapters is vLLM's prefix, with the adapter's own index; FalconH1's mamba layers keep their names."""
    row = arch.architecture({"architectures": ["Zamba2ForCausalLM"]})
    for ab in (0, 1):
        prefix = f"model.feed_forward.gate_up_proj_adapter_list.{adapter}.{'AB'[ab]}"
        assert row.runtime_name(ADAPTER.format(layer, adapter, ab)) == prefix
        assert row.exclusion_name(ADAPTER.format(layer, adapter, ab)) == prefix
    assert module_state(VLLM.entries["Zamba2ForCausalLM"], ADAPTER.format(layer, adapter, 0)) == "quantized"
    falcon = arch.architecture({"architectures": ["FalconH1ForCausalLM"]})
    assert falcon.runtime_name("model.layers.0.mamba.in_proj") == "model.layers.0.mamba.in_proj"


@pytest.mark.parametrize("checkpoint", ["model.layers.3.self_attn.q_proj", "model.layers.3.self_attn.k_proj",
                                        "model.layers.3.self_attn.v_proj", "model.layers.3.self_attn.indexer.index_qk_proj",
                                        "model.layers.3.attn_hyper_connection.input_mix_weight_down"])
def test_qwen4exp_rows_are_its_qsa_build(checkpoint):
    """Every Qwen4Exp checkpoint carries the QSA indexer (transformers' class builds one in every attention layer), and
    from such a config vLLM 0.32 builds QSA attention: one linear for q/k/v and the indexer's q/k
    (qwen4_exp/nvidia/qsa.py Qwen4ExpQSAQKVIndexerLinear) that takes no ModelOpt FP4 method (nvidia/model.py
    without_modelopt_fp4). The profile is generated from that build (tools/vllm_runtime.py flash_attention_stand_in);
    the QSA-less one vLLM builds from a config without indexer_n_heads (the same layer a quantized QKVParallelLinear)
    is its `without` (tests/test_qwen4exp_without_qsa.py). Every checkpoint shard of a fused layer built unquantized
    takes its role (the hyper-connection mixer's too)."""
    entry = VLLM.entries["Qwen4ExpForCausalLM"]
    assert entry["modules"]["model.layers.*.self_attn.qkv_proj"] == {"state": "unquantized",
                                                                     "layer": "Qwen4ExpQSAQKVIndexerLinear"}
    assert entry["without"]["modules"]["model.layers.*.self_attn.qkv_proj"] == {"state": "quantized", "layer": "QKVParallelLinear"}
    row = arch.architecture({"architectures": ["Qwen4ExpForCausalLM"], "indexer_n_heads": 4})
    assert [r for r in row.unquantized_roles if r.covers(checkpoint, "modelopt-nvfp4", "NVFP4")], row.unquantized_roles
    assert not [r for r in row.unquantized_roles if r.covers("model.layers.3.self_attn.o_proj", "modelopt-nvfp4", "NVFP4")]


def test_no_data_file_holds_a_temp_folder_name():
    """A generator's run-local temp folder (`/tmp/tmpXXXX`) in a recorded reason makes the file differ on every
    regeneration (vLLM 0.30's Qwen2-VL rows quoted the small config's folder), so the data is not reproducible."""
    from pathlib import Path

    data = Path(profiles.__file__).parent / "data"
    found = {f.name: re.findall(r"/tmp/tmp\w+", f.read_text()) for f in sorted(data.glob("*.json"))}
    assert not {name: names for name, names in found.items() if names}
