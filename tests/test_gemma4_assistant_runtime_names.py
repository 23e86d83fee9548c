"""The Gemma 4 assistant's `draft_model.` names are vLLM's, not every runtime's.

vLLM 0.32 builds the drafter inside its speculative wrapper and asks its quant config about
`draft_model.pre_projection` (repair/arch/gemma4_assistant.py `draft_prefix`). SGLang 0.5.23 builds
`Gemma4AssistantForCausalLM` (sglang/srt/models/gemma4_mtp.py:59-107 in the 0.5.23 wheel) as the model itself:
model_loader/loader.py:285-309 `_initialize_model` passes no prefix, and the class names its layers
`add_prefix("pre_projection", prefix)` and `add_prefix("model", prefix)`, so SGLang asks `pre_projection`, the
checkpoint's name. TensorRT-LLM's module-driven loader asks by its modules' names (tests/data/trtllm/PROVENANCE.md),
never vLLM's wrapper prefix. So an entry only the checkpoint's name matches (`re:^pre_projection$`) excludes the
handshake for SGLang and not for vLLM.
"""

from __future__ import annotations

import json

import pytest

from repair import arch
from tests.conftest import read_json, run_captured

ANCHORED = ["lm_head", "re:^pre_projection$", "re:^post_projection$"]


@pytest.fixture
def anchored(capsys, ct_export, tmp_path):
    """fix's output (the handshake BF16), its `ignore` rewritten with entries anchored on the checkpoint names."""
    out = tmp_path / "fixed"
    assert run_captured(capsys, "fix", ct_export, "-o", out, "--quiet")[0] == 0
    config = read_json(out / "config.json")
    config["quantization_config"]["ignore"] = ANCHORED
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_sglang_reads_the_checkpoint_names_of_the_drafter(capsys, anchored):
    code, out, err = run_captured(capsys, "doctor", anchored, "--target", "sglang==0.5.23", "--strict", "--json")
    assert code == 0, [f["message"] for f in json.loads(out)["findings"]]


def test_vllm_reads_them_under_draft_model(capsys, anchored):
    code, out, _ = run_captured(capsys, "doctor", anchored, "--target", "vllm==0.32.0", "--json")
    subjects = {f["subject"] for f in json.loads(out)["findings"] if f["severity"] == "error"}
    assert code == 1 and {"pre_projection", "post_projection"} <= subjects


def test_the_prefix_is_a_fact_of_the_vllm_row_only():
    """Data, not a runtime test: a target whose rules borrow vLLM's rows (SGLang, TensorRT-LLM) gets the row without
    vLLM's own-code names, as generated rows drop their `prefixes` (arch/profiled.py OWN_CODE)."""
    config = {"model_type": "gemma4_assistant", "architectures": ["Gemma4AssistantForCausalLM"]}
    assert arch.architecture(config).runtime_name("pre_projection") == "draft_model.pre_projection"
    borrowed = arch.architecture(config, borrowed=True)
    assert borrowed.runtime_name("pre_projection") == "pre_projection"
    assert borrowed.runtime_name("model.layers.0.mlp.gate_proj") == "model.layers.0.mlp.gate_proj"
    assert borrowed.exclusion_name("model.layers.0.mlp.gate_proj") == "model.layers.0.mlp.gate_proj"
