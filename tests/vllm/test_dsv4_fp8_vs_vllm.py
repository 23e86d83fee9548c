"""nvidia/DeepSeek-V4-Flash-NVFP4's own `fp8` form, judged by vLLM 0.32's loader of its NVIDIA class.

The tiny export (tools/dsv4_fp8_fixture.py: the real config.json, tiny dimensions) is loaded the way `vllm serve DIR`
would (tools/vllm_load.py, weights tracked: every parameter filled, every name placed, or its exact error), and
doctor --target vllm==0.32.0 must say what happened; what fix --target writes must load. The names are vLLM's own
published ones (its mapper read backwards: the oracle of test_dsv4_gpu_class_vs_vllm, same layer kinds)."""

from __future__ import annotations

import re

import pytest
import torch

from tests.conftest import run_cli
from tools import dsv4_fp8_fixture

from .probe import requires_vllm
from .test_dsv4_gpu_class_vs_vllm import doctor, oracle, vllm_load  # noqa: F401 - oracle is a fixture

pytestmark = [pytest.mark.vllm, requires_vllm]
QUANT_LEAVES = re.compile(r"\.(scale|weight_scale|weight_scale_2|input_scale)$")


def _bf16(module: str):
    def edit(tensors):
        tensors.pop(f"{module}.scale")
        tensors[f"{module}.weight"] = tensors[f"{module}.weight"].to(torch.bfloat16)
    return edit


def _fix(folder, out, target="vllm==0.32.0"):
    assert run_cli("fix", folder, "-o", out, "--target", target) == 0
    return out


def test_the_fixture_holds_vllms_published_names(oracle):  # noqa: F811
    """Every name vLLM's own BF16 build publishes, and, beyond them, only the routed gate's `bias` of the layers that
    are not hash-routed: the real config's noaux_tc router has one (the mapper's `.ffn.gate.bias` ->
    `e_score_correction_bias`), the oracle's transformers config none; the load tests place it."""
    names = {n for n in dsv4_fp8_fixture.tensors(dsv4_fp8_fixture.config()) if not QUANT_LEAVES.search(n)}
    assert set(oracle["published"]) <= names
    assert sorted(names - set(oracle["published"])) == ["layers.1.ffn.gate.bias", "layers.2.ffn.gate.bias"]


@pytest.mark.parametrize("mtp", [False, True], ids=["main", "with-mtp-block"])
def test_the_published_form_loads_as_doctor_says(tmp_path, mtp):
    """With the published `mtp.0.*` block too: the main model's mapper drops every name holding `mtp.` (weights
    tracked, nothing unplaced), and doctor, reading the row's `mtp.` drop, checks nothing there."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", mtp=mtp)
    loaded = vllm_load(folder)
    assert loaded["ok"] and loaded["quantization"] == "deepseek_v4_fp8", loaded.get("error")
    methods = {k: v["method"] for k, v in loaded["methods"].items()}
    assert {m for k, m in methods.items() if ".attn.w" in k or ".attn.fused_wqa_wkv" in k or "indexer.wq_b" in k
            or "shared_experts" in k} == {"Fp8LinearMethod"}, methods
    assert {m for k, m in methods.items() if k.endswith("experts.routed_experts")} == {"ModelOptNvFp4FusedMoE"}
    assert {m for k, m in methods.items() if "compressor" in k or "weights_proj" in k} == {"UnquantizedLinearMethod"}
    code, report = doctor(folder)
    assert code == 0 and not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]


def test_a_bf16_layer_where_vllm_builds_fp8_and_its_fix(tmp_path):
    """vLLM builds wq_b FP8 block: the BF16 weight is cast into it and weight_scale_inv never filled (its tracked
    load says so); doctor errors on it; fix's ignored_layers makes vLLM build it unquantized, and that loads."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16("layers.1.attn.wq_b"))
    loaded = vllm_load(folder)
    assert not loaded["ok"] and "model.layers.1.attn.wq_b.weight_scale_inv" in loaded["error"], loaded
    code, report = doctor(folder)
    assert code == 1 and [f["subject"] for f in report["findings"] if f["severity"] == "error"] == ["layers.1.attn.wq_b"]
    fixed = vllm_load(_fix(folder, tmp_path / "out"))
    assert fixed["ok"], fixed.get("error")
    assert fixed["methods"]["model.layers.1.attn.wq_b"]["method"] == "UnquantizedLinearMethod"


def test_a_bf16_shard_of_a_fused_fp8_layer_and_its_fix(tmp_path):
    """wq_a BF16 beside wkv FP8 block: vLLM loads it without a word (the rows are cast, the fused scale parameter
    counts as filled), so doctor's error is the only warning; fix dequantizes wkv and lists both shards, and vLLM
    then builds fused_wqa_wkv unquantized with every weight filled."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16("layers.1.attn.wq_a"))
    loaded = vllm_load(folder)
    assert loaded["ok"], loaded
    code, report = doctor(folder)
    assert code == 1 and [f["subject"] for f in report["findings"] if f["severity"] == "error"] == ["layers.1.attn.fused_wqa_wkv"]
    fixed = vllm_load(_fix(folder, tmp_path / "out"))
    assert fixed["ok"], fixed.get("error")
    assert fixed["methods"]["model.layers.1.attn.fused_wqa_wkv"]["method"] == "UnquantizedLinearMethod"
    assert fixed["methods"]["model.layers.2.attn.fused_wqa_wkv"]["method"] == "Fp8LinearMethod"


def test_fix_target_bf16_loads_unquantized(tmp_path):
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4")
    fixed = vllm_load(_fix(folder, tmp_path / "out", "bf16"))
    assert fixed["ok"] and fixed["quantization"] is None, fixed.get("error")
    assert {v["method"] for v in fixed["methods"].values()} == {"UnquantizedLinearMethod", "UnquantizedFusedMoEMethod",
                                                                "UnquantizedEmbeddingMethod"}


def test_bf16_routed_experts_of_one_layer_and_their_fix(tmp_path):
    """Layer 0's routed experts stored BF16: vLLM builds them NVFP4 (its tracked load refuses), doctor errors; fix
    --target names them in ignored_layers, whose entry holds the FusedMoE prefix `model.layers.0.ffn.experts` vLLM
    asks about (quant_utils.py:682-686), and vLLM then builds that layer unquantized and loads every weight."""
    from tests.test_dsv4_fp8 import _bf16_experts_of_layer_0

    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16_experts_of_layer_0)
    assert not vllm_load(folder)["ok"]
    code, _ = doctor(folder)
    assert code == 1
    fixed = vllm_load(_fix(folder, tmp_path / "out"))
    assert fixed["ok"], fixed.get("error")
    assert fixed["methods"]["model.layers.0.ffn.experts.routed_experts"]["method"] == "UnquantizedFusedMoEMethod"
    assert fixed["methods"]["model.layers.1.ffn.experts.routed_experts"]["method"] == "ModelOptNvFp4FusedMoE"
