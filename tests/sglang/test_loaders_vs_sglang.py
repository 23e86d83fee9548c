"""Rank by rank at TP 2, SGLang's real row-parallel, merged-column and QKV loaders do what doctor predicts.

Each defect (tests/sglang/defects.py) is the real Qwen3-32B fixture with one layer stored in the other precision.
SGLang's own model is built and loaded as rank 0 and as rank 1 of TP 2 (its linears get SGLang's own
`_LogicalGroup(rank, 2)`: tools/sglang_runtime.tensor_parallel) and its load_weights runs unchanged.
- SGLang stops: doctor exits 1, its `runtime_stops_at` for that rank is SGLang's first error, verbatim, and every
  tensor SGLang refuses (each loaded alone) is a finding with SGLang's text for that rank.
- SGLang loads without an error: doctor still reports an error on that layer for that rank (a silent failure),
  and where SGLang's rank holds only zeros (a packed tensor zero-padded into a BF16 row-parallel layer), doctor
  says "zeros on rank N".
"""

from __future__ import annotations

import pytest

from .defects import LAYER, build_defects
from .probe import TARGET, repair_json, requires_sglang, run_probe

pytestmark = [pytest.mark.sglang, requires_sglang]
RANKS = (0, 1)


@pytest.fixture(scope="module")
def defects(tmp_path_factory):
    return build_defects(tmp_path_factory.mktemp("sglang_defects"))


@pytest.fixture(scope="module")
def sglang_ranks(defects) -> dict[tuple[str, int], dict]:
    out = {}
    for rank in RANKS:
        lines = run_probe("load", *defects.values(), "--digests", "--tp-size", 2, "--tp-rank", rank)
        out.update({(name, rank): line for name, line in zip(defects, lines)})
    return out


@pytest.fixture(scope="module")
def doctor_tp2(defects) -> dict[str, tuple[int, dict]]:
    return {name: repair_json("doctor", folder, "--target", TARGET, "--tp", 2) for name, folder in defects.items()}


def error_text(error_type: str, message: str) -> str:
    return f"{error_type}: {message}" if message else error_type  # `assert x` raises with no message


def layer_param(line: dict, name: str) -> dict:
    layer = {"row": "self_attn.o_proj", "merged": "mlp.gate_up_proj", "qkv": "self_attn.qkv_proj"}[name.split("-")[0]]
    return line["params"][f"{LAYER}.{layer}.weight"]


@pytest.mark.parametrize("rank", RANKS)
@pytest.mark.parametrize("name", ["row-packed-into-bf16", "merged-packed-into-bf16", "qkv-packed-into-bf16",
                                  "row-bf16-into-packed", "merged-bf16-into-packed", "qkv-bf16-into-packed"])
def test_each_rank_fails_or_loads_as_doctor_predicts(name, rank, sglang_ranks, doctor_tp2):
    line, (code, report) = sglang_ranks[name, rank], doctor_tp2[name]
    at_rank = [f for f in report["findings"] if f["severity"] == "error" and rank in f["ranks"]]
    assert code == 1 and at_rank, f"{name} rank {rank}: doctor finds nothing ({report['findings']})"
    if line["ok"]:
        assert all(f["runtime_error"] is None for f in at_rank), f"SGLang loads {name} on rank {rank} without an error"
        if name.startswith("row-packed") and layer_param(line, name)["all_zero"]:
            assert any(f"zeros on rank {rank}" in f["message"] for f in at_rank), [f["message"] for f in at_rank]
        return
    first = error_text(line["error_type"], line["error"])
    stops = [s["error"] for s in report["runtime_stops_at"] if s["rank"] == rank]
    assert stops == [first], f"{name} rank {rank}: SGLang stops with {first!r}, doctor predicts {stops}"
    refused = {t: e.removesuffix(": ") for t, e in line["errors"].items() if t.endswith(".weight")}
    predicted = {f["subject"]: f["runtime_error"] for f in at_rank}
    wrong = {t: (predicted.get(t.removesuffix(".weight")), e) for t, e in refused.items()
             if predicted.get(t.removesuffix(".weight")) != e}
    assert not wrong, f"{name} rank {rank}: tensor -> (doctor, SGLang): {wrong}"
