"""nvidia/DeepSeek-V4-Flash-NVFP4's `fp8` form judged for SGLang 0.5.23 as it reads it (repair/targets/sglang_dsv4_fp8.py).

SGLang 0.5.23 wraps Fp8Config in HybridFp8NvFp4Config (model_loader/loader.py:222-247): every Linear its model asks
FP8 block, each routed-experts layer NVFP4 (modelopt_quant.py:1747-1763), compressors, router, embedding and head
without the quant config; the same per-layer schemes the format declares, so doctor judges the published form (it was
refused in one line). Where SGLang reads the config otherwise (no nvfp4_moe_meta, a non-empty Fp8Config list it
matches against its own layer names, `ignore` naming its experts) doctor still refuses in one line. The SGLang tier
builds 0.5.23's model with its own quant config (tests/sglang/test_dsv4_fp8_vs_sglang.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tools import dsv4_fp8_fixture
from tests.conftest import run_captured

SGLANG = "sglang==0.5.23"


def doctor(capsys, folder: Path, target: str = SGLANG) -> tuple[int, dict | str]:
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", target, "--json")
    return code, (json.loads(out) if code in (0, 1) else err)


def edited(folder: Path, **quant) -> Path:
    config = json.loads((folder / "config.json").read_text())
    for key, value in quant.items():
        if value is None:
            config["quantization_config"].pop(key, None)
        else:
            config["quantization_config"][key] = value
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_published_form_is_judged_as_sglang_builds_it(capsys, tmp_path):
    code, report = doctor(capsys, dsv4_fp8_fixture.write(tmp_path / "dsv4"))
    assert code == 0 and not [f for f in report["findings"] if f["severity"] == "error"], report


def test_an_attention_layer_stored_bf16_is_an_error_sglang_builds_it_fp8_block(capsys, tmp_path):
    def bf16(tensors):
        del tensors["layers.1.attn.wo_b.scale"]
        tensors["layers.1.attn.wo_b.weight"] = tensors["layers.1.attn.wo_b.weight"].to(torch.bfloat16)

    code, report = doctor(capsys, dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=bf16))
    assert code == 1, report
    assert {f["subject"] for f in report["findings"] if f["severity"] == "error"} == {"layers.1.attn.wo_b"}, report


@pytest.mark.parametrize("quant, said", [
    ({"quant_algo": None}, "model_config.py:775-794"),
    ({"ignored_layers": ["layers.1.attn.wq_b"]}, "quantization_config.ignored_layers"),
    ({"modules_to_not_convert": ["head"]}, "quantization_config.modules_to_not_convert"),
    ({"ignore": ["*.experts"]}, "model.layers.0.mlp.experts"),
])
def test_a_config_sglang_reads_otherwise_is_refused_in_one_line(capsys, tmp_path, quant, said):
    code, err = doctor(capsys, edited(dsv4_fp8_fixture.write(tmp_path / "dsv4"), **quant))
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err, err


def test_fix_cannot_exclude_a_bf16_layer_for_sglang_and_says_so(capsys, tmp_path):
    """fix --target sglang==0.5.23 on a BF16 attention layer refused with `config.json: SGLang 0.5.23 matches
    quantization_config.ignored_layers ...; doctor cannot judge it`: the list it named is the one fix would write (the
    input has none), and doctor's advice was `exclude it (fix --target does)`. SGLang matches that list against its
    own layer names (fp8.py:354-364), so no entry fix writes both runtimes read: fix says it cannot, and what does."""
    def bf16(tensors):
        del tensors["layers.1.attn.wo_b.scale"]
        tensors["layers.1.attn.wo_b.weight"] = tensors["layers.1.attn.wo_b.weight"].to(torch.bfloat16)

    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=bf16)
    code, out, err = run_captured(capsys, "fix", str(folder), "-o", str(tmp_path / "out"), "--target", SGLANG)
    assert code == 2 and not (tmp_path / "out").exists(), err
    [line] = err.strip().splitlines()
    assert "layers.1.attn.wo_b" in line and "cannot exclude" in line and "store it quantized" in line, line
    assert "doctor cannot judge" not in line, line
    code, report = doctor(capsys, folder)
    [finding] = [f for f in report["findings"] if f["severity"] == "error"]
    assert "(fix --target does)" not in finding["message"] and "store it quantized" in finding["message"], finding["message"]


@pytest.mark.parametrize("release", ["0.5.12", "0.5.17"])
def test_a_release_whose_file_does_not_describe_the_form_names_the_one_that_does(capsys, tmp_path, release):
    """sglang==0.5.17 (read with 0.5.12's file, which does not describe the form) sent the user to a vLLM target only;
    the shipped sglang-0.5.23.json judges the form, so the line names it too."""
    code, said = doctor(capsys, dsv4_fp8_fixture.write(tmp_path / "dsv4"), f"sglang=={release}")
    assert code == 2, said
    [line] = said.strip().splitlines()
    assert "not described" in line and "--target sglang==0.5.23" in line, line


@pytest.mark.parametrize("group_size, said", [
    (32, "group_size 32"), (0, "group_size 0"), (True, "group_size 1"),
    ("abc", "not a whole number"), ([16], "not a whole number"), ("1" * 5000, "not a whole number"),
])
def test_a_group_size_sglang_reads_otherwise_is_refused_in_one_line(capsys, tmp_path, group_size, said):
    """SGLang 0.5.23 builds the experts' ModelOptFp4Config with int(group_size) (model_config.py:786, loader.py:243):
    32 (or True, 1) is another NVFP4 grouping, "abc" or [16] stops it reading the config; doctor said 'nothing to do'."""
    code, err = doctor(capsys, edited(dsv4_fp8_fixture.write(tmp_path / "dsv4"), group_size=group_size))
    assert code == 2 and len(err.strip().splitlines()) == 1 and said in err and len(err) < 1500, err


@pytest.mark.parametrize("group_size", [16, "16", 16.5])
def test_a_group_size_sglang_reads_as_16_is_judged(capsys, tmp_path, group_size):
    code, report = doctor(capsys, edited(dsv4_fp8_fixture.write(tmp_path / "dsv4"), group_size=group_size))
    assert code == 0, report
