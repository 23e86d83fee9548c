"""On every real-config fixture, doctor's per-layer prediction for sglang==0.5.23 is what SGLang 0.5.23 itself decides.

SGLang's side: its own model class built with the quant config its loader makes (ModelOpt*Config.from_config or
CompressedTensorsConfig; each layer's get_quant_method runs is_layer_skipped, is_layer_excluded,
_resolve_quant_algo or should_ignore_layer and the fused-shard checks), then its own load_weights
(tools/sglang_probe.py). doctor's side: `doctor --json --target sglang==0.5.23`.

- Built: `schemes` (stored layer -> nvfp4 / w4a16_nvfp4 / fp8 / bf16) equals SGLang's on every stored layer SGLang
  builds; a failure lists every (layer, doctor's answer, SGLang's answer).
- SGLang refuses to build the model (fused shards that disagree, a target it cannot match): doctor exits 1 with a
  finding whose runtime error is SGLang's text, verbatim.
- SGLang's load_weights raises: doctor exits 1 and names each tensor's error as SGLang words it.
"""

from __future__ import annotations

import pytest

from .fixtures import FIXTURES
from .probe import TARGET, disagreements, repair_json, requires_sglang, sglang_schemes, stored_layers

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture(scope="module")
def doctor(real_fixtures) -> dict[str, tuple[int, dict]]:
    return {name: repair_json("doctor", folder, "--target", TARGET) for name, folder in real_fixtures.items()}


def predicted_errors(report: dict) -> set[str]:
    return {f["runtime_error"] for f in report.get("findings", []) if f.get("runtime_error")}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_doctor_schemes_are_sglangs_decisions(name, real_fixtures, sglang_verdicts, doctor):
    line = sglang_verdicts[name]
    code, report = doctor[name]
    if line.get("stage") == "build":
        pytest.skip(f"SGLang does not build the model ({line['error_type']}); test_sglang_refusals_are_predicted")
    sglang = {m: s for m, s in sglang_schemes(line, stored_layers(real_fixtures[name])).items() if s != "not loaded"}
    doctors = {m: s for m, s in report.get("schemes", {}).items() if m in sglang}
    assert code in (0, 1), report
    assert not disagreements(doctors, sglang), (
        f"{name}: (layer, doctor, SGLang) {disagreements(doctors, sglang)}")


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_sglang_refusals_are_predicted(name, sglang_verdicts, doctor):
    line = sglang_verdicts[name]
    code, report = doctor[name]
    if line["ok"]:
        assert code != 1 or not predicted_errors(report), (
            f"{name}: SGLang loads it, doctor predicts {sorted(predicted_errors(report))[:3]}")
        return
    texts = {f"{line['error_type']}: {line['error']}"} if line["stage"] == "build" else set(line["errors"].values())
    assert code == 1, f"{name}: SGLang fails ({sorted(texts)[:2]}), doctor exits {code}"
    assert texts <= predicted_errors(report), (
        f"{name}: SGLang's errors doctor does not predict: {sorted(texts - predicted_errors(report))}; "
        f"doctor predicts {sorted(predicted_errors(report))[:5]}")
