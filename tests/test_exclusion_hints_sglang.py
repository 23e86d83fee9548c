"""A BF16 shard (k_proj) stored in a fused layer an SGLang release builds quantized: the load-error hint says what
exactly to write (the entries that release's own matching rule reads as excluding the whole fused layer: its shards,
and for SGLang 0.5.9-0.5.10, which ask a fused layer only by its own name, `qkv_proj` too) and where, and which other
shards must be dequantized; the entries are the ones `fix --target` for that release adds, and its output is clean."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_captured
from tests.test_config_forms import qwen3_with_bf16_shard

ATTN = "model.layers.0.self_attn"
SHARDS = [f"{ATTN}.k_proj", f"{ATTN}.q_proj", f"{ATTN}.v_proj"]


@pytest.mark.parametrize("target, entries", [("sglang==0.5.9", [*SHARDS, f"{ATTN}.qkv_proj"]),
                                             ("sglang==0.5.11", SHARDS), ("sglang==0.5.23", SHARDS)])
def test_the_k_proj_hint_names_the_entries_the_release_reads(capsys, tmp_path, target, entries):
    folder = qwen3_with_bf16_shard(tmp_path / "k", f"{ATTN}.k_proj")
    code, text, _ = run_captured(capsys, "doctor", folder, "--target", target, "--json")
    (f,) = [f for f in json.loads(text)["findings"] if f["subject"] == f"{ATTN}.k_proj"]
    written = ", ".join(f"`{e}`" for e in entries)
    assert f"write {written} in hf_quant_config.json quantization.exclude_modules" in f["message"], f["message"]
    assert f"dequantize `{ATTN}.q_proj` and `{ATTN}.v_proj`" in f["message"], f["message"]
    assert "exclude it (fix" not in f["message"], f["message"]
    code, _, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", target, "--quiet")
    assert code == 0, err
    added = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert sorted(added) == sorted(["lm_head", *entries]), added
    code, text, _ = run_captured(capsys, "doctor", tmp_path / "out", "--target", target, "--strict", "--json")
    assert code == 0, json.loads(text)["findings"]
