"""SGLang 0.5.9-0.5.11 have no DeepSeek-V4: their config reader refuses it, in transformers' words, before anything else.

Each release reads config.json with the transformers it pins (0.5.9: 4.57.1, 0.5.10: 5.3.0, 0.5.11: 5.6.0), after
registering its own config classes (get_config, sglang/srt/utils); none of them knows model_type `deepseek_v4`, so
AutoConfig raises "The checkpoint you are trying to load has model type `deepseek_v4` but Transformers does not
recognize this architecture" and no layer is built (0.5.12 registers its own DeepSeekV4 config). doctor said, for the
published fp8 form, that the rules file does not describe the form, and for the ModelOpt form 72 per-tensor errors;
now one error, the release's own refusal (the rules file's `config_model_types`, tools/sglang_config_types.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools import dsv4_fp8_fixture
from tests.conftest import run_captured

NVIDIA = dsv4_fp8_fixture.REAL.parent / "hf_quant_config.json"
REFUSAL = "The checkpoint you are trying to load has model type `deepseek_v4` but Transformers does not recognize"


def modelopt(folder: Path) -> Path:
    dsv4_fp8_fixture.write(folder)
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(NVIDIA, folder / "hf_quant_config.json")
    return folder


@pytest.mark.parametrize("release, pinned", [("0.5.9", "4.57.1"), ("0.5.10", "5.3.0"), ("0.5.11", "5.6.0")])
@pytest.mark.parametrize("form", ["fp8", "modelopt"])
def test_a_release_without_deepseek_v4_refuses_its_config_once(capsys, tmp_path, release, pinned, form):
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4") if form == "fp8" else modelopt(tmp_path / "dsv4")
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", f"sglang=={release}", "--json")
    assert code == 1, err
    report = json.loads(out)
    [finding] = report["findings"]
    assert finding["code"] == "config-refused" and REFUSAL in finding["message"] and f"transformers {pinned}" in finding["message"]
    assert [stop["error"] for stop in report["runtime_stops_at"]] == [finding["runtime_error"]] and REFUSAL in finding["runtime_error"]


def test_releases_that_read_it_record_it():
    for release in ("0.5.12", "0.5.23"):
        from repair.targets.profiles import resolve

        known = resolve(f"sglang=={release}").profile.rules.config_model_types
        assert "deepseek_v4" in known["known"], release


def test_a_release_read_with_an_older_file_is_not_refused_by_its_pin(capsys, tmp_path):
    """A release past the newest file (0.5.24, read with 0.5.23's) pins its own transformers: 0.5.23's list of model
    types is its own only. 0.5.13-0.5.22 once fell back to 0.5.12's file this way; each now has its own (0.5.21:
    transformers 5.12.1, which does not know the type either)."""
    folder = modelopt(tmp_path / "dsv4")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "not_a_transformers_type"}))
    said = {}
    for release in ("0.5.12", "0.5.21", "0.5.24"):
        code, out, err = run_captured(capsys, "doctor", str(folder), "--target", f"sglang=={release}", "--json")
        assert code in (0, 1), err
        said[release] = [f["code"] for f in json.loads(out)["findings"]]
    assert said["0.5.12"] == said["0.5.21"] == ["config-refused"] and "config-refused" not in said["0.5.24"], said


# SGLang 0.5.23 registers these model types outside `_CONFIG_REGISTRY`'s list (asked of the installed release: its
# CONFIG_MAPPING after sglang.srt.utils.hf_transformers.common is imported): `_CONFIG_REGISTRY.update` over a tuple of
# classes (deepseek_v41: common.py:225, configs/deepseek_v41.py:84), an annotated `model_type: str =` (jet_nemotron.py:27),
# AutoConfig/CONFIG_MAPPING.register in the config modules (qwen3_asr.py:168, unlimited_ocr.py:627, a loop over classes:
# muse_spark.py:253-259, cosmos3_edge_projector: common.py:312-319).
REGISTERED_ELSEWHERE = ("deepseek_v41", "deepseek_v41_text", "deepseek_v41_vision", "jet_nemotron", "qwen3_asr_thinker",
                        "unlimited-ocr", "muse_spark", "muse_spark_text", "muse_spark_vision", "muse_spark_audio",
                        "cosmos3_edge_projector")


@pytest.mark.parametrize("model_type", ["deepseek_v41", "jet_nemotron", "unlimited-ocr"])
def test_a_model_type_sglang_registers_outside_its_list_is_read(capsys, tmp_path, model_type):
    """DeepSeek-V4.1's config (model_type deepseek_v41, SGLang 0.5.23 reads it and renames its architecture to
    DeepseekV4ForCausalLM) was called refused: 'no change to the weights helps'."""
    folder = modelopt(tmp_path / "dsv4")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": model_type}))
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", "sglang==0.5.23", "--json")
    assert code in (0, 1), err
    assert "config-refused" not in [f["code"] for f in json.loads(out)["findings"]]


def test_every_model_type_sglang_registers_outside_its_list_is_recorded():
    from repair.targets.profiles import resolve

    known = resolve("sglang==0.5.23").profile.rules.config_model_types["known"]
    assert [t for t in REGISTERED_ELSEWHERE if t not in known] == []


def test_a_huge_model_type_is_shown_cut(capsys, tmp_path):
    """config.json's model_type is hostile: 100,000 characters of it made three output lines of ~100,000 characters
    (the release's refusal repeated it whole); it is shown cut, as every listed name is (arch/resolved.py shown)."""
    folder = modelopt(tmp_path / "dsv4")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": "a" * 100_000}))
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", "sglang==0.5.23")
    assert code == 1, err
    assert max(map(len, (out + err).splitlines())) < 2000
