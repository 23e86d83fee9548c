"""doctor's summary line on a model no generated profile covers: a person reads the first line, and may read nothing
else. "nothing to do" there read as a verdict (an attack on the coverage stream: Step3Text's NVFP4 exports, which
vLLM 0.32 refuses, were called "nothing to do" once their rows were dropped); it names the gap instead."""

from __future__ import annotations

import json
import shutil

import pytest

from tests.conftest import run_captured
from tools.real_fixture import write_real_model


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    return write_real_model(tmp_path_factory.mktemp("uncovered") / "qwen3", "qwen3-32b")


def as_arch(src, tmp_path, name):
    """The same files under another listed class (config.json rewritten)."""
    out = tmp_path / "m"
    shutil.copytree(src, out)
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(dict(config, architectures=[name])))
    return out


@pytest.mark.parametrize("targets", ["vllm==0.32.0", "sglang==0.5.23", "vllm==0.32.0,sglang==0.5.23"])
def test_a_model_no_profile_covers_is_not_called_nothing_to_do(capsys, qwen3, tmp_path, targets):
    src = as_arch(qwen3, tmp_path, "DeciLMForCausalLM")  # registered in vLLM 0.32, its config is remote code
    code, out, err = run_captured(capsys, "doctor", src, "--target", targets)
    first = out.splitlines()[0]
    assert code == 0 and "nothing to do" not in first, out
    assert "do not cover DeciLMForCausalLM" in first or "does not cover DeciLMForCausalLM" in first, first
    assert "generic roles only" in first, first


@pytest.mark.parametrize("targets", ["vllm==0.32.0", "vllm==0.32.0,sglang==0.5.23"])
def test_a_covered_healthy_model_still_has_nothing_to_do(capsys, qwen3, targets):
    code, out, err = run_captured(capsys, "doctor", qwen3, "--target", targets)
    assert code == 0 and out.splitlines()[0].endswith("; nothing to do"), out
