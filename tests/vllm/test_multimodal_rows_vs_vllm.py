"""Gemma 4's generated multimodal row (tools/vllm_profile.py builds Gemma4ForConditionalGeneration with its vision
tower) judged by vLLM 0.32's own loader on the same files: a Gemma-4-31B-IT-shaped NVFP4 export as published
(tools/real_fixture.py: `model.language_model.*`, vision tower excluded by wildcard) loads, and doctor says nothing;
the same export with its vision encoder's linears stored NVFP4 and not excluded does not load (vLLM builds the tower
unquantized under ModelOpt NVFP4), and doctor names each of them; fix --target writes a copy vLLM loads.
(From GENERIC roles, before the row, doctor called the second healthy.) One vLLM process for the three folders.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_captured
from tools.real_fixture import write_real_model
from tools.real_fixture_variants import write_gemma4_vision_packed

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
TARGET = "vllm==0.32.0"


def test_gemma4_31b_doctor_agrees_with_vllm_load(tmp_path, capsys):
    healthy = write_real_model(tmp_path / "healthy", "gemma-4-31b-it")
    packed = write_gemma4_vision_packed(tmp_path / "packed")
    verdicts = {}
    for folder in (healthy, packed):
        code, out, err = run_captured(capsys, "doctor", "--target", TARGET, str(folder), "--json")
        verdicts[folder] = (code, {f["subject"] for f in json.loads(out)["findings"] if f["severity"] == "error"})
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, str(packed), "-o", str(tmp_path / "fixed"))
    assert code == 0, out + err
    loads = {line["dir"]: line for line in in_vllm("vllm_load.py", healthy, packed, tmp_path / "fixed")}
    assert all(line["stand_in_calls"] == [] for line in loads.values()), loads
    assert loads[str(healthy)]["ok"] and verdicts[healthy] == (0, set()), (loads[str(healthy)], verdicts[healthy])
    refused = loads[str(packed)]
    assert not refused["ok"] and "vision_tower.encoder.layers.0." in refused["error"], refused
    code, errors = verdicts[packed]
    assert code == 1 and len(errors) == 7 and all(e.startswith("model.vision_tower.encoder.layers.0.") for e in errors)
    assert loads[str(tmp_path / "fixed")]["ok"], loads[str(tmp_path / "fixed")]
