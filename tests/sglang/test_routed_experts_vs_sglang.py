"""One routed expert exported BF16 and excluded by a per-expert entry, on the real DeepSeek-V3-0324 layout (#28 attack):
SGLang 0.5.23's FusedMoE asks its quant config only with the layer's own prefix `...mlp.experts`
(ModelOptQuantConfig._get_quant_method: is_layer_excluded, never is_layer_skipped, never an expert's name), so the
entry reaches nothing: SGLang builds the MoE NVFP4 and stops on the BF16 expert. doctor's per-layer schemes are
SGLang's on the input; `fix --target sglang==0.5.23` (alone: it exited 3, its plan read the per-expert entries as
excluding those experts) and with vLLM names the MoE layer whole, and SGLang loads the output with that MoE BF16,
no error, no weight skipped. Expert by expert, doctor's loader account is SGLang's own FusedMoE loader's: the stop,
the error text of each tensor it refuses (each loaded alone) and, for a tensor it takes without an error that is
stored in the other precision, a silent error; both directions (a BF16 expert in an NVFP4 MoE, packed experts in an
MoE excluded whole)."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tools.real_fixture import REAL_MODELS, write_real_model

from .fixtures import _published_keys
from .probe import TARGET, disagreements, load_in_sglang, repair_json, requires_sglang, sglang_schemes, stored_layers
from .test_fix_loads_in_sglang import drafts

pytestmark = [pytest.mark.sglang, requires_sglang]
MOE = "model.layers.10.mlp.experts"
TARGETS = (TARGET, "vllm==0.32.0," + TARGET)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("sglang_routed_experts")
    model = REAL_MODELS["deepseek-v3-0324"]
    model = dataclasses.replace(model, bf16=model.bf16 + rf"|^{MOE.replace('.', '[.]')}[.]1[.]")
    src = _published_keys(write_real_model(root / "src", "deepseek-v3-0324", model))
    hf = json.loads((src / "hf_quant_config.json").read_text())
    hf["quantization"]["exclude_modules"].append(f"{MOE}.1*")
    (src / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    excluded = _published_keys(write_real_model(root / "excluded", "deepseek-v3-0324"))
    hf = json.loads((excluded / "hf_quant_config.json").read_text())
    hf["quantization"]["exclude_modules"].append(MOE)
    (excluded / "hf_quant_config.json").write_text(json.dumps(hf, indent=4))
    out = {"src": src, "excluded": excluded}
    for i, target in enumerate(TARGETS):
        code, report = repair_json("fix", src, "-o", root / f"out-{i}", "--target", target)
        assert code == 0, (target, report)
        out[target] = root / f"out-{i}"
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> dict:
    return load_in_sglang(list(folders.values()))


def test_sglang_builds_the_moe_nvfp4_as_doctor_predicts(folders, loaded):
    line = loaded[folders["src"]]
    code, report = repair_json("doctor", folders["src"], "--target", TARGET)
    assert line["layers"][MOE]["scheme"] == "nvfp4" and not line["ok"], line["layers"][MOE]
    assert code == 1 and report["runtime_stops_at"], report["findings"]
    sglang = {m: s for m, s in sglang_schemes(line, stored_layers(folders["src"])).items() if s != "not loaded"}
    doctors = {m: s for m, s in report["schemes"].items() if m in sglang}
    assert not disagreements(doctors, sglang), disagreements(doctors, sglang)


@pytest.mark.parametrize("target", TARGETS)
def test_fix_output_loads_with_the_moe_bf16(target, folders, loaded):
    line, out = loaded[folders[target]], folders[target]
    listed = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert MOE in listed, listed
    weights = [t for t in line.get("skipped", []) if t.endswith(".weight") and not drafts(out, t)]
    assert line["ok"] and not weights, (line.get("error_type"), line.get("error"), line.get("errors"), weights)
    assert line["layers"][MOE]["scheme"] == "bf16", line["layers"][MOE]
    assert repair_json("doctor", out, "--target", TARGET, "--strict")[0] == 0


@pytest.mark.parametrize("name", ["src", "excluded"])
def test_each_expert_fails_or_loads_as_doctor_predicts(name, folders, loaded):
    line = loaded[folders[name]]
    code, report = repair_json("doctor", folders[name], "--target", TARGET)
    assert not line["ok"] and line["stage"] == "load", line.get("error")
    first = f"{line['error_type']}: {line['error']}"
    assert code == 1 and [s["error"] for s in report["runtime_stops_at"]] == [first], report["runtime_stops_at"]
    findings = {f["subject"]: f for f in report["findings"] if f["severity"] == "error" and f["subject"].startswith(MOE)}
    refused = {t.removesuffix(".weight"): e for t, e in line["errors"].items() if t.endswith(".weight")}
    assert refused and {m: findings.get(m, {}).get("runtime_error") for m in refused} == refused
    taken = {t.removesuffix(".weight") for t in line["routes"] if t.startswith(MOE) and t.endswith(".weight")}
    silent = {m: findings[m]["code"] for m in taken - set(refused) if m in findings}
    assert silent and set(silent.values()) == {"silent-garbage"}, (silent, sorted(findings))
    assert all(findings[m]["runtime_error"] is None for m in silent)


def test_fix_of_per_expert_entries_for_vllm_and_sglang_loads_in_sglang(tmp_path):
    """ModelOpt's per-expert entries (`...experts.1.gate_proj`: vLLM reads them as excluding the MoE, SGLang reads
    nothing): fix for both names the layer and drops them (tests/test_routed_expert_entries.py); SGLang builds that MoE
    BF16 and the others NVFP4, no error, no weight skipped."""
    from tests.test_routed_expert_entries import EXPERT_ENTRIES, write_one_bf16_expert

    src = _published_keys(write_one_bf16_expert(tmp_path / "src", EXPERT_ENTRIES))
    code, report = repair_json("fix", src, "-o", tmp_path / "out", "--target", TARGETS[1])
    assert code == 0, report
    line = load_in_sglang([tmp_path / "out"])[tmp_path / "out"]
    weights = [t for t in line.get("skipped", []) if t.endswith(".weight") and not drafts(tmp_path / "out", t)]
    assert line["ok"] and not weights, (line.get("error_type"), line.get("error"), weights)
    assert line["layers"][MOE]["scheme"] == "bf16" and line["layers"]["model.layers.9.mlp.experts"]["scheme"] == "nvfp4"
