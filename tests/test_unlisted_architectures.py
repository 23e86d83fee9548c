"""config.json listing no architectures (absent, null or []), read as the release does (the profile's `unlisted`,
tools/vllm_registry.py: vLLM's own get_config and registry; tests/vllm/test_registry_vs_vllm.py asks vLLM 0.32 itself).
vLLM 0.28-0.32 name the class from model_type, as the transformers beside them map it to a base model
(transformers_utils/config.py `MODEL_MAPPING_NAMES[model_type]`: dbrx -> DbrxModel), which the registry builds converted
to a pooling model (`_normalize_arch`: DbrxForCausalLM as an embedding model, which generates no text); a model_type
mapped to no class leaves the list empty, and the registry refuses it: "No model architectures are specified"."""

from __future__ import annotations

import json

import pytest

from repair import arch
from repair.targets.profiles import resolve
from tests.conftest import run_captured
from tests.test_doctor_load_refused import DBRX, DBRX_ERROR, write_dbrx
from tests.test_listed_architectures import doctor_json, unregistered

NEWEST = next(p.registry for p in arch.PROFILES if p.label == "vllm 0.32.0")
UNMAPPED = "gemma4_unknown_type"  # a model_type transformers maps to no class (not in the recorded MODEL_MAPPING_NAMES)


def unlisted(tmp_path, form: str, model_type: str = "dbrx"):
    config = {k: v for k, v in DBRX.items() if k != "architectures"} | {"model_type": model_type}
    if form != "absent":
        config["architectures"] = None if form == "null" else []
    return write_dbrx(tmp_path / form, quantized=True, config=config)


def test_the_recorded_mapping_is_transformers_base_model_of_each_model_type():
    assert NEWEST.unlisted["dbrx"] == "DbrxModel" and NEWEST.unlisted["llama"] == "LlamaModel"
    assert UNMAPPED not in NEWEST.unlisted and NEWEST.unlisted_refused == "No model architectures are specified"


@pytest.mark.parametrize("form", ["absent", "null", "empty"])
def test_vllm_builds_the_base_model_of_model_type_as_a_pooling_model(tmp_path, capsys, form):
    """DbrxModel -> DbrxForCausalLM converted to an embedding model: doctor says so (a warning: it loads, but serves no
    text generation), reads the DBRX row (its load_weights fails, in vLLM's words), and says what to list."""
    built = resolve("vllm==0.32.0").built(json.loads((unlisted(tmp_path / "x", form) / "config.json").read_text()))
    assert (built.name, built.derived, built.runner) == ("DbrxForCausalLM", "DbrxModel", "pooling"), built
    code, found = doctor_json(capsys, unlisted(tmp_path, form), "--target", "vllm==0.32.0")
    [f] = unregistered(found)
    assert f["severity"] == "warning" and "DbrxModel" in f["message"] and "pooling" in f["message"], f
    assert '["DbrxForCausalLM"]' in f["message"], f
    assert [g["runtime_error"] for g in found["findings"] if g["code"] == "load-refused"] == [DBRX_ERROR]


def test_a_model_type_mapped_to_no_class_is_refused_in_vllms_words_on_every_rank(tmp_path, capsys):
    folder = unlisted(tmp_path, "absent", UNMAPPED)
    code, found = doctor_json(capsys, folder, "--target", "vllm==0.32.0", "--tp", "2")
    [f] = unregistered(found)
    error = "ValueError: No model architectures are specified"
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == error and UNMAPPED in f["message"], f
    assert [(s["rank"], s["error"]) for s in found["runtime_stops_at"]] == [(0, error), (1, error)]
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "fixed", "--target", "vllm==0.32.0")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "[unregistered-architecture]" in err, err
    assert not (tmp_path / "fixed").exists()


def test_a_hostile_model_type_is_cut_and_cannot_forge_a_line(tmp_path, capsys):
    folder = unlisted(tmp_path, "absent", "x\nerror: forged" + "y" * 100_000)
    code, out, err = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0")
    assert code == 1 and not [line for line in out.splitlines() if line.startswith("error: forged")], out
    assert len(out) < 20_000


def test_the_gemma4_assistant_is_not_judged_without_architectures(tmp_path, capsys):
    """vLLM loads a gemma4_assistant as the draft Gemma4MTPModel whatever it lists (config/speculative.py:1019-1028)."""
    from repair.demo.examples import write_assistant

    folder = write_assistant(tmp_path / "assistant")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({k: v for k, v in config.items() if k != "architectures"}))
    assert not unregistered(doctor_json(capsys, folder, "--target", "vllm==0.32.0")[1])


def test_a_release_without_the_fact_reads_nothing_listed_as_before():
    """SGLang 0.5.11's rules record its registry's names only (0.5.23's record its config reader's refusal too):
    nothing listed is not judged (no error claimed)."""
    built = resolve("sglang==0.5.11").built({"model_type": "dbrx"})
    assert built.name is None and built.error is None


def test_a_base_model_the_release_builds_no_class_of_is_refused_in_its_words(tmp_path, capsys):
    """bark -> BarkModel, which vLLM 0.32 neither registers nor normalizes, and its Transformers backend does not take:
    refused as a listed one would be ("Model architectures ['BarkModel'] are not supported for now.")."""
    assert NEWEST.unlisted["bark"] == "BarkModel"
    code, found = doctor_json(capsys, unlisted(tmp_path, "absent", "bark"), "--target", "vllm==0.32.0", "--tp", "2")
    [f] = unregistered(found)
    error = "ValueError: " + NEWEST.unsupported.replace("{architectures}", "['BarkModel']")
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == error and "BarkModel" in f["message"], f
    assert [s["error"] for s in found["runtime_stops_at"]] == [error] * 2


def test_a_base_model_its_transformers_backend_builds_says_so(tmp_path, capsys):
    """albert -> AlbertModel: no vLLM class, built by its Transformers backend (as a pooling model)."""
    code, found = doctor_json(capsys, unlisted(tmp_path, "absent", "albert"), "--target", "vllm==0.32.0")
    [f] = unregistered(found)
    assert f["severity"] == "warning" and "Transformers backend" in f["message"] and "pooling" in f["message"], f
