"""A DeepSeek-V4 / V4.1 config.json whose `compress_ratios` SGLang 0.5.23 does not build: one refusal, in its words.

SGLang reads each layer's entry and refuses a value it builds no attention for, or a list shorter than the decoder
(tools/sglang_layer_values.py, learned from its own build: model_type `deepseek_v41`, read by SGLang's own config
class, is refused by its attention's assert, models/deepseek_v4.py:1049; `deepseek_v4` already by the config class of
the transformers it pins, configuration_deepseek_v4.py:255, for any value but 0, 4, 128, past the decoder too).
Before, doctor read a hostile list as dropping nothing and said ~10 missing modules; now it says the one refusal
(doctor/layer_values.py), and `fix --target sglang==0.5.23` refuses in one line before writing.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_captured
from tests.test_sglang_dsv4_drops import SGLANG, nvidia_modelopt
from tests.test_sglang_dsv41_drops import v41

V4_REFUSED = "KeyError: {value}"
V41_REFUSED = "AssertionError: compress_ratio: expected one of (0, 1, 2, 4, 128), got {value}"


def _with(folder: Path, ratios) -> Path:
    config = json.loads((folder / "config.json").read_text()) | {"compress_ratios": ratios}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _doctor(capsys, folder: Path) -> list[dict]:
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", SGLANG, "--json")
    assert code in (0, 1), err
    return json.loads(out)["findings"]


@pytest.mark.parametrize("ratios, error", [
    ([0, 4, 3], V4_REFUSED.format(value=3)),
    ([0, "4", 128], V4_REFUSED.format(value="'4'")),
    ([0, 4, 10 ** 30], V4_REFUSED.format(value=10 ** 30)),
    ([0, 2, 128], V4_REFUSED.format(value=2)),  # V4.1's ratio, in a V4 config
    ([0, 4, 128, 7], V4_REFUSED.format(value=7)),  # past the decoder: transformers maps every entry
    ([0, 4], "must equal `len(layer_types)` (2)"),
])
def test_a_v4_config_sglang_refuses_is_one_refusal(capsys, tmp_path, ratios, error):
    findings = _doctor(capsys, _with(nvidia_modelopt(tmp_path / "v4"), ratios))
    assert [f["code"] for f in findings] == ["build-refused"], findings
    assert error in findings[0]["message"] and "compress_ratios" in findings[0]["message"]


@pytest.mark.parametrize("ratios, error", [
    ([0, 0, 2, 2, 2, 1, 1, 3], V41_REFUSED.format(value=3)),
    ([0, 0, 2, 2, 2, 1, 1, "1"], V41_REFUSED.format(value="1")),
    ([0, 0, 2, 2, 2, 1, 1, -1], V41_REFUSED.format(value=-1)),
    ([0, 0, 2, 2, 2, 1], "IndexError: list index out of range"),
])
def test_a_v41_config_sglang_refuses_is_one_refusal(capsys, tmp_path, ratios, error):
    findings = _doctor(capsys, _with(v41(tmp_path / "v41"), ratios))
    assert [f["code"] for f in findings] == ["build-refused"], findings
    assert error in findings[0]["message"]


@pytest.mark.parametrize("ratios", [[0, 0, 2, 2, 2, 1, 1, 1, 9], [0, 0, 2, 2, 2, 1, 1, 1.0]])
def test_what_sglang_builds_is_not_refused(capsys, tmp_path, ratios):
    """An entry past V4.1's decoder (its model reads none: MTP's) and 1.0 (== 1, which its assert takes) are built."""
    assert "build-refused" not in [f["code"] for f in _doctor(capsys, _with(v41(tmp_path / "v41"), ratios))]


def test_fix_refuses_in_one_line_before_writing(capsys, tmp_path):
    folder = _with(nvidia_modelopt(tmp_path / "v4"), [0, 4, 3])
    code, out, err = run_captured(capsys, "fix", str(folder), "-o", str(tmp_path / "out"), "--target", SGLANG)
    assert code == 2 and not (tmp_path / "out").exists()
    assert "KeyError: 3" in err and "Traceback" not in err, err
