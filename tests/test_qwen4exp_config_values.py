"""Qwen4Exp indexer values set but refused (stop 36's miss): transformers' Qwen4ExpConfig validation, which vLLM 0.32 runs
while reading config.json, refuses values that are not positive, `indexer_kv_heads != 1`, and a budget that is no
multiple of the compress ratio (configuration_qwen4_exp.py:214-219), before any layer is built; and a config with
several indexer fields null, in words that name them. The generator asks vLLM's own config loading (tools/
vllm_config_refusals.py: every proper subset of null fields, and each rule of tools/vllm_profile_configs.py VALUE_RULES
with two probes, recorded only where vLLM refuses both), so doctor quotes the release, never a composed text. The vLLM
tier asks vLLM 0.32 itself on the same configs (tests/vllm/test_attack_qwen4exp.py)."""

from __future__ import annotations

import json

import pytest

from repair.arch.configured import value_refusal
from tests.conftest import run_captured
from tests.test_qwen4exp_without_qsa import INDEXER, write

POSITIVE = "ValueError: QSA config values must be positive"
KV_HEADS = "ValueError: Qwen4-Exp QSA requires indexer_kv_heads=1."
DIVISIBLE = "ValueError: indexer_budget must be divisible by indexer_compress_ratio."
REFUSED = {  # config values -> (the field doctor names, the end of the release's words)
    "n-heads-0": ({"indexer_n_heads": 0}, "indexer_n_heads", POSITIVE),
    "head-dim-negative": ({"indexer_head_dim": -16}, "indexer_head_dim", POSITIVE),
    "ratio-0": ({"indexer_compress_ratio": 0}, "indexer_compress_ratio", POSITIVE),  # before any modulo
    "kv-heads-0": ({"indexer_kv_heads": 0}, "indexer_kv_heads", POSITIVE),  # positivity is checked first
    "kv-heads-2": ({"indexer_kv_heads": 2}, "indexer_kv_heads", KV_HEADS),
    "budget-not-multiple": ({"indexer_budget": 2050}, "indexer_budget", DIVISIBLE),
    "kv-heads-and-budget": ({"indexer_kv_heads": 4, "indexer_budget": 2050}, "indexer_kv_heads", KV_HEADS),  # its order
    "huge-kv-heads": ({"indexer_kv_heads": 10 ** 400}, "indexer_kv_heads", KV_HEADS),
}


def doctor(capsys, folder, target: str = "vllm==0.32.0", *args: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def refusals(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["code"] == "config-refused"]


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_its_validation_refuses_is_refused_in_its_words_on_every_rank(tmp_path, capsys, case):
    values, field, words = REFUSED[case]
    code, report = doctor(capsys, write(tmp_path / case, {**INDEXER, **values}), "vllm==0.32.0", "--tp", "2")
    [f] = refusals(report)
    assert code == 1 and (f["severity"], f["subject"], f["ranks"]) == ("error", field, [0, 1]), f
    assert f["runtime_error"].endswith(words) and f["runtime_error"] in f["message"], f
    assert len(f["message"]) < 1000 and "vllm-0.32.json" in f["message"], f["message"]
    assert [(s["rank"], s["error"]) for s in report["runtime_stops_at"]] == [(0, f["runtime_error"]), (1, f["runtime_error"])]


@pytest.mark.parametrize("values", [{}, {"indexer_budget": 4096, "indexer_compress_ratio": 8}, {"indexer_n_heads": 1}])
def test_values_it_takes_are_not_refused(tmp_path, capsys, values):
    code, report = doctor(capsys, write(tmp_path / "ok", {**INDEXER, **values}))
    assert not refusals(report), report["findings"]


@pytest.mark.parametrize("value", ["2", 2.5, True, [2], {"n": 2}, "", "\u0662"])
@pytest.mark.parametrize("field", ["indexer_kv_heads", "indexer_n_heads"])
def test_a_value_that_is_no_integer_is_judged_by_no_recorded_rule_and_never_crashes(tmp_path, capsys, value, field):
    """The validator's type checks are not recorded, and may stop it before any value rule: no rule claims such a
    config (nothing is composed for it), even where another field breaks one (indexer_kv_heads 2 beside a bad type)."""
    values = {field: value} | ({"indexer_kv_heads": 2} if field != "indexer_kv_heads" else {})
    code, report = doctor(capsys, write(tmp_path / "typed", {**INDEXER, **values}))
    assert not refusals(report), report["findings"]


@pytest.mark.parametrize("value", [True, 4.0, "4", -0.0])
def test_a_null_field_beside_a_value_of_another_type_is_not_quoted_as_missing(tmp_path, capsys, value):
    """transformers' field type check (int | None; a bool is no int there) stops the validator before its missing-field
    test: vLLM 0.32 says "Field 'indexer_n_heads' with value True doesn't match any type" (asked of transformers 5.19 in
    .venv-vllm), not "QSA config is missing required fields", which was recorded for integer values only."""
    folder = write(tmp_path / "mixed", {**INDEXER, "indexer_budget": None, "indexer_n_heads": value})
    assert not refusals(doctor(capsys, folder)[1])


def test_several_null_fields_are_refused_in_the_words_recorded_for_exactly_those(tmp_path, capsys):
    folder = write(tmp_path / "three", {**INDEXER, "indexer_n_heads": None, "indexer_budget": None, "indexer_head_dim": None})
    code, report = doctor(capsys, folder)
    [f] = refusals(report)
    assert f["subject"] == "indexer_n_heads, indexer_head_dim, indexer_budget", f
    assert f["runtime_error"].endswith("missing required fields: ['indexer_n_heads', 'indexer_head_dim', 'indexer_budget'].")


def test_fix_refuses_a_refused_value_in_one_line(tmp_path, capsys):
    folder, out_dir = write(tmp_path / "kv2", {**INDEXER, "indexer_kv_heads": 2}), tmp_path / "out"
    code, out, err = run_captured(capsys, "fix", folder, "-o", out_dir, "--target", "vllm==0.32.0")
    assert code == 2 and err.count("\n") == 1 and "[config-refused] indexer_kv_heads: 2 in config.json" in err, out + err
    assert "a value it takes" in err, err
    assert not out_dir.exists()


@pytest.mark.parametrize("target", ["sglang==0.5.23", "bf16"])
def test_other_targets_are_not_told_vllms_validation(tmp_path, capsys, target):
    assert not refusals(doctor(capsys, write(tmp_path / "kv2", {**INDEXER, "indexer_kv_heads": 2}), target)[1])


def test_a_rule_of_no_known_form_or_shape_claims_nothing():
    part = {"indexer_kv_heads": 2, "indexer_budget": 10, "indexer_compress_ratio": 0}
    rules = [{"field": "indexer_kv_heads", "between": [1, 1]}, {"field": "indexer_budget", "multiple_of": "indexer_compress_ratio"},
             {"field": ["indexer_budget"], "at_least": 1}, {"field": "indexer_kv_heads", "equals": "1"}, {}]
    assert value_refusal(rules, part) is None and value_refusal({"not": "a list"}, part) is None
