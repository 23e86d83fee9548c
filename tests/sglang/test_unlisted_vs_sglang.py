"""A config.json listing no architectures (absent, null or []), asked of SGLang 0.5.23 itself (tools/sglang_registry.py:
its ModelConfig and `get_model_architecture`). Unlike vLLM (tests/vllm/test_registry_vs_vllm.py: a class named from
model_type), SGLang names none: its config reader indexes the list before any class is looked up, so every such config
stops with a Python error while the config is read (absent or null: srt/configs/model_config.py:699
`self.hf_config.architectures[0] in mm_disabled_models`, TypeError; []: srt/utils/hf_transformers/config.py:237
`config.architectures[0] == "Phi4MMForCausalLM"`, IndexError). The rules file records those words
(`transformers_backend.unlisted`, tools/sglang_registry.py), and doctor says SGLang stops there on every rank."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_captured
from tests.test_doctor_load_refused import DBRX, write_dbrx

from .probe import TARGET, requires_sglang
from .test_registry_vs_sglang import in_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
BARE = {k: v for k, v in DBRX.items() if k != "architectures"}
FORMS = {"absent": (BARE, "TypeError: 'NoneType' object is not subscriptable"),
         "null": (dict(BARE, architectures=None), "TypeError: 'NoneType' object is not subscriptable"),
         "empty": (dict(BARE, architectures=[]), "IndexError: list index out of range")}


def test_sglang_refuses_a_config_listing_no_architectures_while_reading_it(tmp_path):
    for name, (config, _) in FORMS.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    answers = in_sglang(*(tmp_path / name for name in FORMS))
    assert [a.get("error") for a in answers] == [error for _, error in FORMS.values()], answers


@pytest.mark.parametrize("form", sorted(FORMS))
def test_doctor_says_sglang_stops_there_on_every_rank(tmp_path, capsys, form):
    folder = write_dbrx(tmp_path / form, quantized=True, config=FORMS[form][0])
    code, out, err = run_captured(capsys, "doctor", folder, "--json", "--target", TARGET, "--tp", "2")
    found = json.loads(out)
    assert code == 1 and [s["error"] for s in found["runtime_stops_at"]] == [FORMS[form][1]] * 2, found["runtime_stops_at"]
