"""What TensorRT-LLM's loader does with each stored layer, rank by rank (`doctor --target trtllm==X`), and that
`fix --target trtllm==X` gives an output clean for it. Built from the real configs in tests/data/real/; each test names
the source behaviour it reproduces (tests/data/trtllm/PROVENANCE.md: repository, path, commit, the rule in words)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import run_captured
from tests.trtllm_helpers import doctor_json, edit_json, findings, write_deepseek_v4
from tools.layout_fixture import write_layout
from tools.real_fixture import write_real_model

BROADCAST = "RuntimeError: The size of tensor a ({}) must match the size of tensor b ({}) at non-singleton dimension 1"


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return write_real_model(tmp_path_factory.mktemp("trt") / "qwen3-32b", "qwen3-32b")


def copy_of(src: Path, dst: Path, tensors=None, quant=None) -> Path:
    shutil.copytree(src, dst)
    if tensors is not None:
        stored = load_file(dst / "model.safetensors")
        tensors(stored)
        save_file(stored, dst / "model.safetensors", metadata={"format": "pt"})
    if quant is not None:
        edit_json(dst / "hf_quant_config.json", lambda d: quant(d["quantization"]))
    return dst


def fixed_is_clean(capsys, src: Path, out: Path, target: str) -> None:
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--target", target, "--quiet")
    assert code == 0, err
    code, report = doctor_json(capsys, out, target, "--strict")
    assert (code, findings(report)) == (0, []), target


def test_report_4_deepseek_v4_excluded_fp8_attention(capsys, tmp_path):
    """TensorRT-LLM#16196 (1.3.0rc15/rc20, nvidia/DeepSeek-V4-*-NVFP4): MIXED_PRECISION excludes the attention
    (`*.attn.*`) but stores it FP8; the layer is built unquantized and DeepSeek's fused_a loader (wq_a + wkv) still
    reads `module.weight_scale`: `AttributeError: 'Linear' object has no attribute 'weight_scale'`. The other excluded
    FP8 projections go through copy_weight (linear.py @ 00bbf71e: `src.to(dst.dtype)` then copy_): cast silently,
    without their scales, which doctor reports as an error naming that behaviour."""
    src = write_deepseek_v4(tmp_path / "dsv4")
    code, report = doctor_json(capsys, src, "trtllm==1.3.0")
    fused_a = findings(report, "load-error")
    assert code == 1 and {f["subject"] for f in fused_a} == {f"layers.{i}.attn.{p}" for i in (0, 1) for p in ("wq_a", "wkv")}
    assert {f["runtime_error"] for f in fused_a} == {"AttributeError: 'Linear' object has no attribute 'weight_scale'"}
    cast = findings(report, "silent-garbage")
    assert {f["subject"] for f in cast} == {f"layers.{i}.attn.{p}" for i in (0, 1) for p in ("wq_b", "wo_a", "wo_b")}
    assert all("copy_weight casts the fp8 weight to bf16 without its scales, silently" in f["message"] for f in cast)
    assert report["schemes"]["layers.0.ffn.experts.0.w1"] == "nvfp4" and report["schemes"]["layers.0.attn.wq_b"] == "bf16"
    # _load_weights_impl (modeling_utils.py @ cb4c622c) walks model.named_modules() and the first exception ends the
    # load: layer 0's fused_a, before layer 1's; the silent casts stop nothing
    (stop,) = report["runtime_stops_at"]
    assert stop["rank"] == 0 and stop["tensor"].startswith("layers.0.attn.w") and stop["error"] == fused_a[0]["runtime_error"]
    fixed_is_clean(capsys, src, tmp_path / "out", "trtllm==1.3.0")


def test_report_10_glm_mtp_layer_not_exported(capsys, tmp_path):
    """NVIDIA/TensorRT#4667 (1.2.0rc5, GLM-4.6 NVFP4 + MTP): the fused qkv loader
    (load_weights_fused_qkv_helper, linear.py @ 00bbf71e) asserts `all('weight' in weights[i] for i in range(3))`,
    and the model serves only without MTP. ModelOpt's own GLM-4.x MoE export (tests/data/real/modelopt-glm4-moe:
    3 layers, num_nextn_predict_layers 1) stores no MTP layer model.layers.3: a warning (it loads without MTP); an
    MTP layer stored without k_proj/v_proj is an error with that assertion."""
    src = write_layout(tmp_path / "glm", "modelopt-glm4-moe")
    code, report = doctor_json(capsys, src, "trtllm==1.2.0")
    (absent,) = findings(report)
    assert (code, absent["code"], absent["subject"], absent["runtime_error"]) == (0, "missing-module", "model.layers.3", "AssertionError")
    assert "model.layers.3.self_attn.qkv_proj" in absent["message"]
    partial = write_layout(tmp_path / "glm2", "modelopt-glm4-moe", change={
        "model.layers.3.self_attn.q_proj.weight": ("BF16", (64, 64))})
    code, report = doctor_json(capsys, partial, "trtllm==1.2.0")
    (qkv,) = [f for f in findings(report, "load-error") if f["subject"].endswith("qkv_proj")]
    assert (code, qkv["runtime_error"]) == (1, "AssertionError")


@pytest.mark.parametrize("tp,rank_errors", [(1, {0: (64, 32)}), (2, {0: (32, 16), 1: (32, 16)})])
def test_excluded_packed_row_parallel_layer_breaks_per_rank(capsys, qwen3, tmp_path, tp, rank_errors):
    """load_weight_shard slices the checkpoint tensor by its own width (ceil(width / tp)), not the parameter's; then
    copy_weight's copy_ raises torch's broadcast error: an excluded o_proj stored packed [64, 32] into BF16 [64, 64]
    is (64) vs (32) at TP 1 and, split on its input dim, (32) vs (16) on each rank at TP 2."""
    src = copy_of(qwen3, tmp_path / "o", quant=lambda q: q["exclude_modules"].append("model.layers.0.self_attn.o_proj"))
    code, report = doctor_json(capsys, src, "trtllm==1.2.0", "--tp", str(tp))
    (o_proj,) = findings(report, "load-error")
    assert (o_proj["subject"], o_proj["ranks"]) == ("model.layers.0.self_attn.o_proj", sorted(rank_errors))
    assert o_proj["runtime_error"] == BROADCAST.format(*rank_errors[0])
    assert report["runtime_stops_at"] == [{"rank": r, "tensor": "model.layers.0.self_attn.o_proj", "error": BROADCAST.format(*e)}
                                          for r, e in rank_errors.items()]
    fixed_is_clean(capsys, src, tmp_path / "out", "trtllm==1.2.0")


def test_fused_nvfp4_shards_must_share_their_scalars(capsys, qwen3, tmp_path):
    """NVFP4LinearMethod.load_weight_scales (linear.py @ 00bbf71e): `assert input_scale == w["input_scale"]` /
    weight_scale_2 across the shards of qkv_proj (vLLM takes the max instead)."""
    def differ(role):
        def change(t):
            t[f"model.layers.0.self_attn.k_proj.{role}"] = t[f"model.layers.0.self_attn.k_proj.{role}"] * 2
        return change
    for role, text in (("input_scale", "AssertionError: The input_scale should be same for all the weights"),
                       ("weight_scale_2", "AssertionError: The weight_scale_2 should be same for all the weights")):
        src = copy_of(qwen3, tmp_path / role, tensors=differ(role))
        code, report = doctor_json(capsys, src, "trtllm==1.2.0")
        (qkv,) = findings(report, "fused-shards")
        assert (code, qkv["subject"], qkv["runtime_error"]) == (1, "model.layers.0.self_attn.qkv_proj", text)
        fixed_is_clean(capsys, src, tmp_path / f"{role}.out", "trtllm==1.2.0")


def test_missing_input_scale_fails_before_dynamic_quantization(capsys, qwen3, tmp_path):
    """load_weight_scales computed alpha as `input_scale.float() * weight_scale_2.float()` unconditionally
    (AttributeError on a missing input_scale); at 00bbf71e a missing input_scale means dynamic activation quantization
    (the 1.3 and 1.4 files)."""
    def drop(t):
        for p in ("q_proj", "k_proj", "v_proj"):
            del t[f"model.layers.1.self_attn.{p}.input_scale"]
    src = copy_of(qwen3, tmp_path / "s", tensors=drop)
    _, old = doctor_json(capsys, src, "trtllm==1.2.0")
    loads = [(f["code"], f["subject"], f["runtime_error"]) for f in findings(old) if f["runtime_error"]]
    assert loads == [("fused-shards", "model.layers.1.self_attn.qkv_proj", "AttributeError: 'NoneType' object has no attribute 'float'")]
    _, new = doctor_json(capsys, src, "trtllm==1.3.0")
    assert not [f for f in findings(new) if f["runtime_error"]]


def test_scales_nobody_requests_are_ignored_with_a_warning(capsys, qwen3, tmp_path):
    """vllm#45102's layout (lm_head excluded, stored BF16 with an NVFP4 input_scale left over): _load_weights_impl is
    module-driven (filter_weights by module name), so TensorRT-LLM never reads the scale; doctor warns (the weight
    loads; only an unused scale is dropped). vLLM raises on the unknown name instead."""
    def leftover(t):
        t["lm_head.input_scale"] = torch.tensor(0.02)
    src = copy_of(qwen3, tmp_path / "lm", tensors=leftover)
    code, report = doctor_json(capsys, src, "trtllm==1.2.0")
    (ignored,) = findings(report)
    assert (code, ignored["code"], ignored["severity"], ignored["subject"]) == (0, "ignored-tensors", "warning", "lm_head")
    assert "never asks for lm_head.input_scale" in ignored["message"]
    fixed_is_clean(capsys, src, tmp_path / "out", "trtllm==1.2.0")


@pytest.mark.parametrize("release", ["1.0.0", "1.2.0", "1.3.0", "1.4.0"])
def test_fix_of_a_bf16_shard_in_a_quantized_fused_layer_is_clean(capsys, qwen3, tmp_path, release):
    """sglang#36596's layout on Qwen3's real config: q_proj stored BF16 and excluded by `*.self_attn.q_proj`, k/v
    NVFP4. 1.0 asks only qkv_proj (NVFP4: the BF16 shard breaks torch.cat); 1.1+ builds it BF16 (the packed shards
    break it). fix --target dequantizes every shard and the output is clean for that release."""
    def bf16_q(t):
        from repair.codec import nvfp4
        name = "model.layers.0.self_attn.q_proj"
        t[f"{name}.weight"] = nvfp4.dequantize(t.pop(f"{name}.weight"), t.pop(f"{name}.weight_scale"),
                                               t.pop(f"{name}.weight_scale_2")).to(torch.bfloat16)
        del t[f"{name}.input_scale"]
    src = copy_of(qwen3, tmp_path / "q", tensors=bf16_q, quant=lambda q: q["exclude_modules"].append("*.self_attn.q_proj"))
    code, report = doctor_json(capsys, src, f"trtllm=={release}")
    assert code == 1 and findings(report, "load-error")
    fixed_is_clean(capsys, src, tmp_path / "out", f"trtllm=={release}")


def test_a_hostile_tensor_parallel_degree_is_one_finding_not_a_billion_ranks(capsys, qwen3):
    """Past the degrees TRT-LLM's loader is simulated for (tp_rules.MAX_DEGREE): one finding. Past the ranks doctor
    simulates for any target (tp_rules.MAX_RANKS): one usage line, exit 2, before any per-rank work."""
    code, report = doctor_json(capsys, qwen3, "trtllm==1.2.0", "--tp", "1000")
    assert code == 1 and [f["code"] for f in findings(report)] == ["tp-impossible"]
    code, out, err = run_captured(capsys, "doctor", qwen3, "--target", "trtllm==1.2.0", "--json", "--tp", "1000000000")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "at most 4096 ranks" in err, err


def test_laguna_regex_ignore_entries_are_silently_unmatched_before_pr_13844(capsys, tmp_path):
    """Laguna-M.1-NVFP4's real compressed-tensors block (tests/data/real/laguna-m.1-nvfp4): its `ignore` keeps the
    attention BF16 with `re:` entries. Before PR #13844 (fnmatchcase, modeling_utils.py @ 01ea6d79) they match no
    module, so TensorRT-LLM builds the stored-BF16 attention NVFP4 and copy_weight fails (the Laguna porting
    write-up's "silently mis-quantizes"); from 1.3 (re.fullmatch) it loads. fix --target trtllm==1.1.0 writes the
    modules' plain names into `ignore` (a `re:` entry would match nothing there) and the output is clean."""
    src = write_real_model(tmp_path / "laguna", "ct-laguna-moe")
    code, old = doctor_json(capsys, src, "trtllm==1.1.0")
    errors = findings(old, "load-error")
    assert code == 1 and errors and all(".self_attn." in f["subject"] for f in errors)
    assert {f["runtime_error"].split(" (")[0] for f in errors} == {"RuntimeError: The size of tensor a"}
    code, new = doctor_json(capsys, src, "trtllm==1.3.0", "--strict")
    assert (code, findings(new)) == (0, [])
    fixed_is_clean(capsys, src, tmp_path / "out", "trtllm==1.1.0")
    ignore = __import__("json").loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["ignore"]
    assert "model.layers.0.self_attn.o_proj" in ignore


def test_healthy_laguna_export_loads_in_trtllm_1_4_whose_gated_mlps_fuse_gate_up(capsys, tmp_path):
    """TensorRT-LLM 1.4 builds Laguna's dense MLP and shared expert as one fused gate_up_proj (trtllm-1.4.json
    `model_fusions`), whose loader asserts one input_scale across gate and up. A producer gives siblings that read one
    input one activation scale (tools/real_fixture.py, ModelOpt's preprocess_linear_fusion): the healthy export is clean;
    only scales that really differ are the loader's assertion (the fixture drew them per module, a false error)."""
    src = write_real_model(tmp_path / "laguna", "ct-laguna-moe")
    code, report = doctor_json(capsys, src, "trtllm==1.4.0", "--strict")
    assert (code, findings(report)) == (0, [])
    up = "model.layers.1.mlp.shared_expert.up_proj.input_global_scale"
    broken = copy_of(src, tmp_path / "differ", tensors=lambda t: t.update({up: t[up] * 2}))
    code, report = doctor_json(capsys, broken, "trtllm==1.4.0")
    stops = {s["error"] for s in report["runtime_stops_at"]}
    assert code == 1 and stops == {"AssertionError: The input_scale should be same for all the weights"}, report


def test_the_load_stops_at_the_first_failing_module_in_named_modules_order(capsys, qwen3, tmp_path):
    """_load_weights_impl (tensorrt_llm/_torch/models/modeling_utils.py @ cb4c622c) loads module by module in
    model.named_modules() order (serially by default there) and the first exception ends the load: layer 2 before
    layer 10 (by index, not by name), a layer's attention before its MLP, the inner model before lm_head."""
    from repair.doctor.module_loads import load_order

    names = ["lm_head", "model.layers.10.self_attn.o_proj", "model.layers.2.mlp.down_proj", "model.layers.2.self_attn.o_proj",
             "model.embed_tokens", "model.layers." + "9" * 5000 + ".mlp.down_proj"]
    assert sorted(names, key=load_order) == ["model.embed_tokens", "model.layers.2.self_attn.o_proj", "model.layers.2.mlp.down_proj",
                                             "model.layers.10.self_attn.o_proj", "model.layers." + "9" * 5000 + ".mlp.down_proj", "lm_head"]
    src = copy_of(qwen3, tmp_path / "two", quant=lambda q: q["exclude_modules"].extend(
        ["model.layers.1.mlp.down_proj", "model.layers.1.self_attn.o_proj"]))
    _, report = doctor_json(capsys, src, "trtllm==1.2.0")
    assert len(findings(report, "load-error")) == 2
    assert [(s["rank"], s["tensor"]) for s in report["runtime_stops_at"]] == [(0, "model.layers.1.self_attn.o_proj")]
