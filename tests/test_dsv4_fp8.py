"""nvidia/DeepSeek-V4-Flash-NVFP4 as published: config.json's `fp8` + `moe_quant_algo: NVFP4` form.

vLLM 0.32 reads quant_method `fp8` on model_type deepseek_v4 as DeepseekV4FP8Config (models/deepseek_v4/
quant_config.py:139-157): every linear layer it builds with the quant config is FP8 block 128x128 (Fp8LinearMethod,
`weight_scale_inv` in float8_e8m0fnu for expert_dtype fp4: :80-84, fp8.py:329-339; the checkpoint's `.scale` mapped
there by nvidia/model.py:1712-1760), routed experts ModelOpt NVFP4 when moe_quant_algo is NVFP4 (:186-195), MXFP4
without it (:196). The tiny export is tools/dsv4_fp8_fixture.py (the real config.json, tiny dimensions).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tools import dsv4_fp8_fixture

from tests.conftest import run_captured


def _doctor(capsys, folder: Path, *extra: str) -> tuple[int, dict | str]:
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", "vllm==0.32.0", "--json", *extra)
    return code, (json.loads(out) if code in (0, 1) else err)


def _errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


def test_the_published_form_is_read_and_loads_clean(capsys, tmp_path):
    """Attention and shared experts FP8 block with ue8m0 scales, routed experts NVFP4, the rest BF16: what vLLM's
    NVIDIA class builds for this config, so doctor finds no error."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4")
    code, report = _doctor(capsys, folder)
    assert code == 0 and not _errors(report), report


def test_float32_block_scales_and_weight_scale_inv_are_read_too(capsys, tmp_path):
    """vLLM copies a float32 block scale into its e8m0 parameter, and `weight_scale_inv` is the name the mapper
    gives `.scale` (nvidia/model.py:1724): both load."""
    def edit(tensors):
        scale = tensors.pop("layers.0.attn.wq_b.scale")
        tensors["layers.0.attn.wq_b.weight_scale_inv"] = scale.to(torch.float32)
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=edit)
    code, report = _doctor(capsys, folder)
    assert code == 0 and not _errors(report), report


def test_an_fp8_layer_stored_bf16_is_an_error(capsys, tmp_path):
    """vLLM builds wq_b FP8 block whatever is stored (the config's `ignore` is no key Fp8Config reads): a BF16 wq_b
    is cast into the float8 parameter and its weight_scale_inv is never filled."""
    def edit(tensors):
        tensors.pop("layers.1.attn.wq_b.scale")
        tensors["layers.1.attn.wq_b.weight"] = tensors["layers.1.attn.wq_b.weight"].to(torch.bfloat16)
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=edit)
    code, report = _doctor(capsys, folder)
    assert code == 1, report
    errors = _errors(report)
    assert [f["subject"] for f in errors] == ["layers.1.attn.wq_b"], errors
    assert "casts" in errors[0]["message"] and "packed" not in errors[0]["message"], errors[0]["message"]


def _bf16_wq_a(tensors):
    tensors.pop("layers.1.attn.wq_a.scale")
    tensors["layers.1.attn.wq_a.weight"] = tensors["layers.1.attn.wq_a.weight"].to(torch.bfloat16)


def test_a_bf16_shard_of_a_fused_fp8_layer_loads_silently_as_garbage(capsys, tmp_path):
    """wq_a BF16 beside wkv FP8 block: vLLM builds fused_wqa_wkv FP8 block, casts wq_a's rows into it (same shape: no
    assertion fails) and its scale rows stay unfilled while the parameter counts as loaded (measured: the tracked
    load says nothing). doctor's error says so, with no runtime error vLLM never raises."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16_wq_a)
    code, report = _doctor(capsys, folder)
    fused = [f for f in _errors(report) if f["code"] == "fused-shards"]
    assert code == 1 and [f["subject"] for f in fused] == ["layers.1.attn.fused_wqa_wkv"], report["findings"]
    assert fused[0]["runtime_error"] is None and "silently" in fused[0]["message"], fused[0]


def test_fix_excludes_a_layer_stored_bf16_in_the_list_vllm_reads(capsys, tmp_path):
    """fix --target vllm==0.32.0: `ignored_layers` (the key Fp8Config reads) names the BF16 wq_b, every tensor is
    copied byte for byte, and the output passes doctor."""
    def edit(tensors):
        tensors.pop("layers.1.attn.wq_b.scale")
        tensors["layers.1.attn.wq_b.weight"] = tensors["layers.1.attn.wq_b.weight"].to(torch.bfloat16)
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=edit)
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(folder), "-o", str(out), "--target", "vllm==0.32.0")
    assert code == 0, err
    quant = json.loads((out / "config.json").read_text())["quantization_config"]
    assert quant["ignored_layers"] == ["layers.1.attn.wq_b"]
    assert quant["ignore"] == json.loads((folder / "config.json").read_text())["quantization_config"]["ignore"]
    assert (out / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    code, report = _doctor(capsys, out, "--strict")
    assert code == 0 and not report["findings"], report


def test_without_moe_quant_algo_the_experts_are_mxfp4_and_refused_in_one_line(capsys, tmp_path):
    """No moe_quant_algo: vLLM builds Mxfp4MoEMethod (quant_config.py:196), a format this tool does not read."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4")
    config = json.loads((folder / "config.json").read_text())
    del config["quantization_config"]["moe_quant_algo"]
    (folder / "config.json").write_text(json.dumps(config))
    code, err = _doctor(capsys, folder)
    assert code == 2 and len(err.strip().splitlines()) == 1 and "MXFP4" in err, err


def test_fix_turns_a_fused_layer_bf16_whole_dequantizing_its_fp8_block_shard(capsys, tmp_path):
    """wq_a BF16 beside wkv FP8 block: fix --target vllm==0.32.0 dequantizes wkv (each code times its block's scale,
    codec/fp8_block.py), drops its scale, lists both shards in ignored_layers (vLLM then skips the fused layer: every
    shard listed), and the output passes doctor --strict."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16_wq_a)
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(folder), "-o", str(out), "--target", "vllm==0.32.0")
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["quantization_config"]["ignored_layers"] == [
        "layers.1.attn.wkv", "layers.1.attn.wq_a"]
    with safe_open(out / "model.safetensors", "pt") as fh, safe_open(folder / "model.safetensors", "pt") as src:
        assert "layers.1.attn.wkv.scale" not in fh.keys()
        wkv = fh.get_tensor("layers.1.attn.wkv.weight")
        scale = src.get_tensor("layers.1.attn.wkv.scale").float().repeat_interleave(128, 0).repeat_interleave(128, 1)
        assert torch.equal(wkv, (src.get_tensor("layers.1.attn.wkv.weight").float() * scale).to(torch.bfloat16))
        assert torch.equal(fh.get_tensor("layers.1.attn.wq_a.weight"), src.get_tensor("layers.1.attn.wq_a.weight"))
    code, report = _doctor(capsys, out, "--strict")
    assert code == 0 and not report["findings"], report


def test_fix_refuses_what_it_cannot_do_in_one_line(capsys, tmp_path):
    """--tp reshards ModelOpt checkpoints only: one line, exit 2, nothing written."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16_wq_a)
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(folder), "-o", str(out), "--target", "vllm==0.32.0", "--tp", "2")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "deepseek_v4_fp8" in err, err
    assert not out.exists()


def test_fix_target_bf16_dequantizes_every_layer(capsys, tmp_path):
    """--target bf16: FP8 block linears and NVFP4 experts dequantized, the quantization config removed."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4")
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(folder), "-o", str(out), "--target", "bf16")
    assert code == 0, err
    assert "quantization_config" not in json.loads((out / "config.json").read_text())
    with safe_open(out / "model.safetensors", "pt") as fh:
        dtypes = {fh.get_slice(k).get_dtype() for k in fh.keys() if k.endswith(".weight") and "norm" not in k}
        assert not [k for k in fh.keys() if k.endswith((".scale", "weight_scale", "weight_scale_2", "input_scale"))]
    assert dtypes == {"BF16"}, dtypes


@pytest.mark.parametrize("target", ["sglang==0.5.12", "sglang==0.5.21", "trtllm==1.4"])
def test_a_rules_release_that_does_not_describe_the_form_says_so_in_one_line(capsys, tmp_path, target):
    """A rules file that does not describe the form (SGLang 0.5.12's, which 0.5.13-0.5.22 fall back to; TensorRT-LLM's):
    judged with vLLM's reading through its matchers it got 35 errors no run of SGLang was shown to raise (`.scale`
    dropped, compressors missing). One line, exit 2, naming the file and the target that can judge it. SGLang 0.5.23's
    file describes it (tests/test_sglang_dsv4_fp8.py)."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4")
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", target)
    assert code == 2 and len(err.strip().splitlines()) == 1, out + err
    assert "deepseek_v4_fp8" in err and "vllm" in err, err


def test_the_mtp_block_is_the_drafters_and_the_main_model_reads_none_of_it(capsys, tmp_path):
    """The published `mtp.0.*` (FP8 linears, NVFP4 experts, a BF16 router): vLLM 0.32's main-model mapper drops every
    name holding `mtp.` (nvidia/model.py:1751-1754), recorded as `renames` `{"mtp.": null}`, so doctor checks nothing
    there and says so in a note (it had called mtp.0.ffn.gate an FP8 layer stored BF16); the drafter's own names are
    in the row's `mtp` block (tools/vllm_drafters.py, proven by DeepSeekV4MTP's load_weights)."""
    from repair import arch

    [profile] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.release == (0, 32, 0)]
    row = profile.entries["DeepseekV4ForCausalLM"]
    assert row["renames"]["mtp."] is None
    assert row["mtp"]["renames"]["mtp.*.attn.wq_b"] == "model.layers.*.mtp_block.attn.wq_b"
    assert row["mtp"]["renames"]["mtp.*.e_proj"] == "model.layers.*.e_proj"
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", mtp=True)
    code, report = _doctor(capsys, folder)
    assert code == 0 and not report["findings"], report["findings"]
    assert [n["subject"] for n in report["notes"]] == ["mtp.*"], report["notes"]


def _bf16_experts_of_layer_0(tensors):
    """Layer 0's routed experts stored BF16 (their NVFP4 leaves replaced by a BF16 weight of the logical shape)."""
    for name in [n for n in tensors if n.startswith("layers.0.ffn.experts.") and n.endswith(".weight")]:
        module = name.removesuffix(".weight")
        rows, half = tensors[name].shape
        for leaf in ("weight_scale", "weight_scale_2", "input_scale"):
            tensors.pop(f"{module}.{leaf}")
        tensors[name] = (torch.randn(rows, half * 2) * 0.05).to(torch.bfloat16)


def test_routed_experts_are_excluded_by_an_entry_holding_their_layer(capsys, tmp_path):
    """vLLM asks about a routed-experts layer by its FusedMoE prefix (`model.layers.0.ffn.experts`) and skips it when an
    ignored_layers entry naming experts holds that prefix (quant_utils.py:682-686): the entry `layers.0.ffn.experts`
    (mapped to vLLM's name) builds layer 0's experts unquantized, so BF16 experts there are no error, while without it
    they are."""
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=_bf16_experts_of_layer_0)
    code, report = _doctor(capsys, folder)
    assert code == 1 and {f["subject"].split(".experts.")[0] for f in _errors(report)} == {"layers.0.ffn"}, _errors(report)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["ignored_layers"] = ["layers.0.ffn.experts"]
    (folder / "config.json").write_text(json.dumps(config))
    code, report = _doctor(capsys, folder)
    assert code == 0 and not _errors(report), _errors(report)
