"""vLLM's multimodal *ForConditionalGeneration classes have generated rows (tools/vllm_profile.py builds them with
their towers), so doctor reads a published multimodal export with vLLM's own layers, not generic roles.

The judge of the rows is vLLM 0.32's own loader (tests/vllm/test_multimodal_rows_vs_vllm.py); here: the shipped
profile holds Gemma 4's row, and doctor on a Gemma-4-31B-IT-shaped NVFP4 export (tools/real_fixture.py) uses it:
healthy as published, and an error for each vision-encoder linear stored packed (vLLM builds the tower unquantized).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.real_fixture import write_real_model
from tools.real_fixture_variants import write_gemma4_vision_packed

from tests.conftest import run_captured

TARGET = "vllm==0.32.0"
SHIPPED = Path(__file__).resolve().parents[1] / "repair" / "targets" / "data" / "vllm-0.32.json"


@pytest.fixture(scope="module")
def profile() -> dict:
    return json.loads(SHIPPED.read_text())


def test_gemma4_multimodal_row_records_both_towers(profile):
    row = profile["architectures"]["Gemma4ForConditionalGeneration"]
    modules = row["modules"]
    assert modules["language_model.model.layers.*.mlp.gate_up_proj"]["state"] == "quantized"
    vision = {k: v["state"] for k, v in modules.items() if k.startswith("vision_tower.")}
    assert vision and set(vision.values()) == {"unquantized"}, vision
    assert row["renames"]["model.language_model.layers.*.mlp.gate_proj"] == "language_model.model.layers.*.mlp.gate_proj"
    assert row["fused"] == {"gate_up_proj": ["gate_proj", "up_proj"], "qkv_proj": ["q_proj", "k_proj", "v_proj"]}


def test_every_multimodal_generation_class_is_a_row_or_says_why(profile):
    """The profiler asked every registered *ForConditionalGeneration class: each is a row or an unprofiled reason."""
    assert profile["registered_multimodal"] > 0
    asked = [a for a in (*profile["architectures"], *profile["unprofiled"]) if a.endswith("ForConditionalGeneration")]
    assert len(asked) >= profile["registered_multimodal"]


def test_doctor_reads_gemma4_31b_with_the_generated_row(tmp_path, capsys):
    folder = write_real_model(tmp_path / "g4", "gemma-4-31b-it")
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, str(folder), "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["findings"] == []
    assert "vllm 0.32.0's own (generated profile)" in report["checked"], report["checked"]


def test_doctor_refuses_gemma4_vision_tower_stored_packed(tmp_path, capsys):
    folder = write_gemma4_vision_packed(tmp_path / "g4")
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, str(folder), "--json")
    assert code == 1, out + err
    errors = {f["subject"] for f in json.loads(out)["findings"] if f["severity"] == "error"}
    assert errors == {f"model.vision_tower.encoder.layers.0.{m}.linear" for m in (
        "mlp.down_proj", "mlp.gate_proj", "mlp.up_proj", "self_attn.k_proj", "self_attn.o_proj", "self_attn.q_proj",
        "self_attn.v_proj")}, errors


def test_doctor_names_the_hand_row_it_reads(tmp_path, capsys):
    """Qwen3.6's multimodal class is read with its hand row (repair/arch/moe_routers.py), which wins over a generated
    row of the same class: doctor says so, not "generic layer roles" (what it said before either row existed)."""
    from tools.real_fixture import write_qwen36

    folder = write_qwen36(tmp_path / "q36")
    report = json.loads(run_captured(capsys, "doctor", "--target", TARGET, str(folder), "--json")[1])
    assert "this project's hand row Qwen3.5" in report["checked"], report["checked"]
    assert "generic layer roles" not in report["checked"]
