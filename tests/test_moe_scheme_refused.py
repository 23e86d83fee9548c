"""A weight-only compressed-tensors NVFP4 MoE (llm-compressor's NVFP4A16: `input_activations` null) under SGLang: the
release's `CompressedTensorsConfig.get_moe_scheme` picks the MoE layer's scheme while the model is built. 0.5.9-0.5.11
have no weight-only NVFP4 branch, and their chain's `_is_dynamic_token_w8a8` reads the null input args' `num_bits`
(AttributeError) before it reaches its final raise; 0.5.23 builds CompressedTensorsW4A16Nvfp4MoE. The data is the
release's own predicates run on compressed-tensors' own preset (tools/sglang_moe_schemes.py); doctor names the refusal
as the first error, not the ModelOpt refusal of an hf_quant_config.json the checkpoint does not have."""

from __future__ import annotations

import glob
import json
from pathlib import Path

import pytest

from repair.targets.runtime_rules import shipped_rules
from tests.conftest import run_captured
from tests.test_expert_scales import MOE, compressed_tensors_moe
from tests.test_expert_scales_sglang import weight_only

OLD = ("sglang==0.5.9", "sglang==0.5.10", "sglang==0.5.11", "sglang==0.5.12")
ERROR = "AttributeError: 'NoneType' object has no attribute 'num_bits'"


def doctor(capsys, src: Path, target: str) -> tuple[int, dict]:
    code, text, err = run_captured(capsys, "doctor", src, "--target", target, "--json")
    return code, json.loads(text)


def test_each_release_records_whether_it_builds_a_weight_only_nvfp4_moe():
    facts = {r.label: r.moe_scheme_refused for r in shipped_rules() if r.runtime == "sglang"}
    for label in ("sglang 0.5.9", "sglang 0.5.10", "sglang 0.5.11", "sglang 0.5.12"):
        fact = facts[label]["compressed-tensors"]["W4A16_NVFP4"]
        assert fact["error"] == ERROR and "_is_dynamic_token_w8a8" in fact["where"], (label, fact)
    assert facts["sglang 0.5.23"] == {}, facts["sglang 0.5.23"]


@pytest.mark.parametrize("target", OLD)
def test_older_sglang_refuses_a_weight_only_compressed_tensors_moe_while_building_it(capsys, tmp_path, target):
    src = weight_only(compressed_tensors_moe(tmp_path, broken=()))
    code, doc = doctor(capsys, src, target)
    assert code == 1, doc
    refused = [f for f in doc["findings"] if f["runtime_error"] == ERROR]
    assert [f["subject"] for f in refused] == [MOE.rpartition(".")[0] + ".experts"], doc["findings"]
    (f,) = refused
    assert f["severity"] == "error" and "get_moe_scheme" in f["message"] and "W4A16_NVFP4" in f["message"], f
    assert "while building" in f["message"] and "fix --target bf16" in f["message"], f["message"]
    assert not any(f["subject"] == "hf_quant_config.json" for f in doc["findings"]), doc["findings"]  # none stored
    assert doc["runtime_stops_at"] and all(e["error"] == ERROR for e in doc["runtime_stops_at"]), doc["runtime_stops_at"]


def test_sglang_0_5_23_builds_it_and_a_w4a4_moe_is_built_by_every_release(capsys, tmp_path):
    src = weight_only(compressed_tensors_moe(tmp_path / "a16", broken=()))
    code, doc = doctor(capsys, src, "sglang==0.5.23")
    assert code == 0 and not doc["findings"], doc["findings"]
    w4a4 = compressed_tensors_moe(tmp_path / "a4", broken=())
    for target in OLD:
        code, doc = doctor(capsys, w4a4, target)
        assert code == 0 and not doc["findings"], (target, doc["findings"])


def test_the_generator_reads_the_same_facts_from_the_wheels():
    """Where the wheels are at hand (pip download --no-deps sglang==X), the shipped block is what the tool reads."""
    from tools.sglang_moe_schemes import read_wheel

    wheels = {Path(p).name.split("-")[1]: Path(p) for p in glob.glob("/tmp/sgl*/*/sglang-*.whl")}
    if not wheels:
        pytest.skip("no SGLang wheel downloaded")
    facts = {r.label: r.moe_scheme_refused for r in shipped_rules() if r.runtime == "sglang"}
    shipped = sorted(tuple(map(int, label.split()[1].split("."))) for label in facts)
    for release, wheel in wheels.items():
        block = read_wheel(wheel)[2]
        if f"sglang {release}" in facts:  # its own file: the block as read, less the later releases that build it
            own = {m: {a: {k: v for k, v in f.items() if k != "built_by"} for a, f in algos.items()}
                   for m, algos in facts[f"sglang {release}"].items()}
            assert block == own, release
            continue
        below = max(v for v in shipped if v <= tuple(map(int, release.split("."))))
        for method, algos in facts["sglang " + ".".join(map(str, below))].items():
            for algo, fact in algos.items():  # a release falling back to that file: built_by says whether it builds it
                assert (algo not in block.get(method, {})) == (release in fact.get("built_by", ())), (release, algo)


def test_each_release_0_5_13_to_0_5_22_is_judged_by_its_own_file(capsys, tmp_path):
    """0.5.13-0.5.22 each ship their own file, read from their wheel: 0.5.13-0.5.21 ask `_is_dynamic_token_w8a8` of the
    null input args as 0.5.12 does, 0.5.22 has the weight-only branch (compressed_tensors.py `elif
    self._is_fp4a16_nvfp4(...)`: CompressedTensorsW4A16Nvfp4MoE). Before, they fell back to 0.5.12's file, whose
    `built_by` had to list 0.5.22; now 0.5.22's own file records no refusal and nothing lists it."""
    facts = {r.label: r.moe_scheme_refused for r in shipped_rules()}
    for n in range(13, 22):
        fact = facts[f"sglang 0.5.{n}"]["compressed-tensors"]["W4A16_NVFP4"]
        assert fact["error"] == ERROR and "built_by" not in fact, (n, fact)
    assert facts["sglang 0.5.22"] == {}, facts["sglang 0.5.22"]
    assert "built_by" not in facts["sglang 0.5.12"]["compressed-tensors"]["W4A16_NVFP4"]
    src = weight_only(compressed_tensors_moe(tmp_path, broken=()))
    for target in ("sglang==0.5.22", "sglang==0.5.22.post1"):
        code, doc = doctor(capsys, src, target)
        assert code == 0 and not doc["findings"], (target, doc["findings"])
    code, doc = doctor(capsys, src, "sglang==0.5.21")
    assert code == 1 and [f["runtime_error"] for f in doc["findings"]] == [ERROR], doc["findings"]


def dense_weight_only(root: Path, key: str = "qwen3-32b") -> Path:
    """Qwen3 (dense; `key` another real layout) as llm-compressor's NVFP4A16 writes it: the real ModelOpt fixture converted by compressed-tensors'
    own converter (tools/ct_export.py), `input_activations` null, no input_global_scale."""
    from safetensors.torch import load_file, save_file

    from tools.ct_export import convert_modelopt
    from tools.real_fixture import write_real_model

    src = write_real_model(root / "modelopt", key)
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if not k.endswith(("k_scale", "v_scale"))}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "ignore": ["lm_head", *(["re:.*mlp.gate$"] if "a3b" in key else [])]}
    (src / "config.json").write_text(json.dumps(config))
    out = convert_modelopt(src, root / "ct")
    (out / "hf_quant_config.json").unlink(missing_ok=True)
    return weight_only(out)


@pytest.mark.parametrize("target", ["sglang==0.5.9", "sglang==0.5.21"])
def test_older_sglang_refuses_a_weight_only_compressed_tensors_linear_while_building_it(capsys, tmp_path, target):
    """Measured on each wheel 0.5.9-0.5.21 (their `_is_*` predicates compiled as tools/sglang_moe_schemes.py does, asked
    in `_get_scheme_from_parts`'s order on compressed-tensors' NVFP4A16 preset): none holds before `_is_static_tensor_w8a8`,
    whose `weight_quant.num_bits == input_quant.num_bits == 8` reads the null input args (AttributeError: 'NoneType'
    object has no attribute 'num_bits'; 0.5.9 compressed_tensors.py:600); 0.5.22/0.5.23 take `_is_fp4a16_nvfp4`. So
    those releases stop at the first quantized Linear they build (a dense model's q/k/v; a MoE's attention before its
    experts), and doctor says nothing for a dense model (exit 0, 'nothing to do'). Before b2851c3, 0.5.9/0.5.10 gave an
    error here in ModelOpt's words (hf_quant_config.json's quant_algo); no longer applying that to a compressed-tensors
    config made it silent."""
    src = dense_weight_only(tmp_path)
    code, doc = doctor(capsys, src, target)
    assert code == 1 and doc["runtime_stops_at"] and all(e["error"] == ERROR for e in doc["runtime_stops_at"]), doc
    assert all(".self_attn." in s["tensor"] for s in doc["runtime_stops_at"]), doc["runtime_stops_at"]
    (f,) = [f for f in doc["findings"] if f["runtime_error"] == ERROR]  # the first Linear the build meets, once
    assert f["subject"].startswith("model.layers.0.self_attn.") and "_get_scheme_from_parts" in f["message"], f
    assert "W4A16_NVFP4" in f["message"] and "fix --target bf16" in f["message"], f["message"]


def test_each_release_records_whether_it_builds_a_weight_only_nvfp4_linear():
    """Every release's own file: 0.5.9-0.5.21 refuse it, 0.5.22 and 0.5.23 build it."""
    facts = {r.label: r.linear_scheme_refused for r in shipped_rules() if r.runtime == "sglang"}
    for n in range(9, 22):
        fact = facts[f"sglang 0.5.{n}"]["compressed-tensors"]["W4A16_NVFP4"]
        assert fact["error"] == ERROR and "_is_static_tensor_w8a8" in fact["where"] and "built_by" not in fact, (n, fact)
    assert facts["sglang 0.5.22"] == facts["sglang 0.5.23"] == {}, facts["sglang 0.5.22"]


def test_sglang_0_5_22_and_0_5_23_build_a_dense_weight_only_model(capsys, tmp_path):
    src = dense_weight_only(tmp_path)
    for target in ("sglang==0.5.22", "sglang==0.5.23"):
        code, doc = doctor(capsys, src, target)
        assert code == 0 and not doc["findings"], (target, doc["findings"])


@pytest.mark.parametrize("target", ["sglang==0.5.9", "sglang==0.5.21"])
def test_a_moe_stops_at_its_first_attention_layer_before_its_experts(capsys, tmp_path, target):
    """Qwen3-30B-A3B's layout exported weight-only: the decoder layer builds self_attn before its mlp, so the build stops
    at layer 0's attention (the Linear scheme choice) before it asks get_moe_scheme about layer 0's experts."""
    src = dense_weight_only(tmp_path, "qwen3-30b-a3b")
    code, doc = doctor(capsys, src, target)
    refused = [f for f in doc["findings"] if f["runtime_error"] == ERROR]
    assert code == 1 and refused[0]["subject"].startswith("model.layers.0.self_attn."), doc["findings"]
    assert any(f["subject"].endswith(".experts") for f in refused), doc["findings"]  # still said, after it
    assert [s["tensor"] for s in doc["runtime_stops_at"]] == [refused[0]["subject"]], doc["runtime_stops_at"]
