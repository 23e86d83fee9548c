"""doctor --target sglang==X asks the config about the layers SGLang builds under its own names (#28).

SGLang 0.5.23's DeepSeek-V4 names its layers `model.layers.N.self_attn.wqkv_a`, `mlp.experts`, ... where the checkpoint
(and vLLM) say `layers.N.attn.fused_wqa_wkv`, `ffn...`; RedHatAI's compressed-tensors targets name vLLM's layers, so
SGLang's constructor finds no target for its own and refuses the model. The names are the release data's
`built_layers`, generated from SGLang's model code (tools/sglang_built_layers.py; the SGLang tier checks both the data
and the refusal against SGLang itself: tests/sglang/test_built_layers_vs_sglang.py).
"""

from __future__ import annotations

import json
import shutil
import time

from repair.doctor.built_layers import built_names
from tests.conftest import run_captured
from tools import dsv4_fixture

SGLANG = "sglang==0.5.23"
STOP = "ValueError: Unable to find matching target for model.layers.0.self_attn.wqkv_a in the compressed-tensors config."
NVIDIA = dsv4_fixture.REAL.parents[1] / "deepseek-v4-flash-nvfp4" / "hf_quant_config.json"


def doctor(capsys, folder, target) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", target, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def test_doctor_predicts_sglang_refusing_vllm_named_targets(tmp_path, capsys):
    folder = dsv4_fixture.write(tmp_path / "redhatai")
    code, report = doctor(capsys, folder, SGLANG)
    assert code == 1
    assert {stop["error"] for stop in report["runtime_stops_at"]} == {STOP}  # where SGLang's constructor stops first
    assert doctor(capsys, folder, "vllm==0.32.0")[0] == 0  # the targets name vLLM's own layers


def test_configs_that_name_no_layer_of_sglang_are_not_refusals(tmp_path, capsys):
    """nvidia's ModelOpt MIXED_PRECISION keys resolve no SGLang layer: SGLang builds them BF16, it does not refuse."""
    folder = dsv4_fixture.write(tmp_path / "nvidia")
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(NVIDIA, folder / "hf_quant_config.json")
    _, report = doctor(capsys, folder, SGLANG)
    assert not [f for f in report["findings"] if "under its own name" in f["message"]]


def test_a_hostile_layer_count_is_bounded(tmp_path, capsys):
    folder = dsv4_fixture.write(tmp_path / "huge")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 10**9}))
    started = time.monotonic()
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", SGLANG)
    assert code in (1, 2) and time.monotonic() - started < 60, err


def test_built_names_follow_the_construction_order():
    patterns = ["model.embed", "model.layers.*.a", "model.layers.*.b", "lm_head"]
    assert [n for _, n in built_names(patterns, 2)] == ["model.embed", "model.layers.0.a", "model.layers.0.b",
                                                         "model.layers.1.a", "model.layers.1.b", "lm_head"]


def test_a_config_whose_targets_reach_sglangs_layers_is_not_refused(tmp_path, capsys):
    """Targets by class name (`Linear`, as find_matched_target also tries) reach every layer SGLang builds."""
    folder = dsv4_fixture.write(tmp_path / "by_class")
    config = json.loads((folder / "config.json").read_text())
    groups = config["quantization_config"]["config_groups"]
    next(iter(groups.values()))["targets"].append("Linear")
    (folder / "config.json").write_text(json.dumps(config))
    _, report = doctor(capsys, folder, SGLANG)
    assert not [f for f in report["findings"] if "under its own name" in f["message"]]
    assert STOP not in {stop["error"] for stop in report["runtime_stops_at"]}


def test_rewriting_the_rules_from_the_wheel_keeps_the_generated_layers(tmp_path, monkeypatch):
    """tools/sglang_rules_data.py rewrites a release file from its wheel, which has no built model: the block generated
    from the installed release's model code must survive it."""
    from tools import sglang_rules_data

    kept = {"built_layers": {"A": {"x.*.y": "Linear"}}, "moe_scheme_refused": {"compressed-tensors": {"W4A16_NVFP4": {}}},
            "moe_backend_overrides": {"A": [{"backend": "marlin", "when": "always", "where": "x.py:1"}]}}
    (tmp_path / "sglang-9.9.9.json").write_text(json.dumps({"rules": kept}))
    monkeypatch.setattr(sglang_rules_data, "DATA", tmp_path)
    monkeypatch.setattr(sglang_rules_data, "ROOT", tmp_path)
    monkeypatch.setattr(sglang_rules_data, "profile", lambda path, wheels=None: {"release": "9.9.9", "rules": {"packed_modules_mapping": {}}})
    assert sglang_rules_data.main(["sglang-9.9.9-py3-none-any.whl"]) == 0
    rules = json.loads((tmp_path / "sglang-9.9.9.json").read_text())["rules"]
    assert {k: rules[k] for k in kept} == kept, rules


def test_sglang_builds_no_fused_layer_of_the_vllm_row_it_does_not_name():
    """SGLang's layer rows are vLLM 0.32's, whose DeepSeek-V4 fuses `fused_wqa_wkv` (wq_a+wkv) and the compressors'
    `fused_wkv_wgate`; SGLang 0.5.23 builds neither name (its `built_layers`: `wqkv_a`, `wkv_gate`), so a checkpoint
    shard is asked as itself, as SGLang's quant config answers it (tests/sglang/test_ct_groups_vs_sglang.py), while a
    row fusion SGLang does build under the row's leaf (shared_experts `gate_up_proj` from w1/w3) stays."""
    from repair import arch
    from repair.targets.profiles import resolve

    target = resolve(SGLANG)
    config = json.loads(dsv4_fixture.REAL.read_text())
    family = arch.architecture(config, target.release)
    rules = target.profile.rules
    assert set(family.fused_layers) >= {"fused_wqa_wkv", "fused_wkv_wgate"}  # the vLLM row this guards against
    building = rules.building("DeepseekV4ForCausalLM", family.fused_layers, config)
    leaves = {p.rpartition(".")[2] for p in rules.built_layers["DeepseekV4ForCausalLM"]}
    for name in ("layers.0.attn.wq_a", "layers.0.attn.wkv", "layers.1.attn.compressor.wkv",
                 "layers.1.attn.indexer.compressor.wgate", "layers.0.ffn.shared_experts.w1"):
        layer, kind = building.built_layer(name)
        assert kind == "linear" and layer == name or layer.rpartition(".")[2] in leaves, (name, layer)
    assert building.built_layer("layers.0.ffn.shared_experts.w3") == ("layers.0.ffn.shared_experts.gate_up_proj", "fused")
