"""compressed-tensors configs whose config groups have different schemes (FP8 block + NVFP4): read per layer.

The real config is RedHatAI/DeepSeek-V4-Flash-NVFP4-FP8's (tests/data/real/, PROVENANCE.md): group_0 FP8 block
128x128 for attention projections, group_1 NVFP4 for the FFN and expert projections. vLLM 0.32 and SGLang 0.5.23
(CompressedTensorsConfig.get_scheme_dict / find_matched_target) give a layer not ignored the scheme of the first
target that matches it; tests/vllm/test_ct_groups_vs_vllm.py and tests/sglang/test_ct_groups_vs_sglang.py ask their
own functions the same cases (CASES).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from repair import formats
from repair.formats.ct_groups import ORDERS
from repair.io.checkpoint import open_checkpoint
from tests.conftest import read_json, run_captured
from tests.ct_group_cases import CASES, ORDER_CASE, case_config, quantization_config

REAL = Path(__file__).parent / "data" / "real" / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json"


def write(folder: Path, quantization_config: dict, tensors: dict | None = None) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = read_json(REAL)
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors or {"x.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    return folder


def declaration(folder: Path):
    ckpt = open_checkpoint(folder)
    return formats.detect(ckpt).read_declaration(ckpt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_layer_gets_the_first_matching_targets_scheme(tmp_path, case):
    config, layers = case_config(case), CASES[case][1]
    d = declaration(write(tmp_path / case, config))
    got = {prefix: d.algorithm(prefix, {k: tuple(v) for k, v in CASES[case][2].items()}) for prefix in layers}
    assert got == layers


def test_vllm_tries_fused_shards_before_class_names_and_sglang_after(tmp_path):
    groups, prefix, expected = ORDER_CASE
    d = declaration(write(tmp_path / "order", quantization_config(groups, [])))
    packed = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    assert d.algorithm(prefix, packed) == expected["vllm"]
    assert d.group_algos.ordered(ORDERS["sglang"]).resolve(prefix, packed) == expected["sglang"]


def test_the_real_mixed_config_is_read_not_refused(capsys, tmp_path):
    src = write(tmp_path / "real", read_json(REAL)["quantization_config"])
    code, out, err = run_captured(capsys, "inspect", src, "--json")
    assert (code, err) == (0, "")
    assert json.loads(out)["declaration"]["config_group_targets"] == [
        ["re:.*attn.*(fused_wqa_wkv|wq_b|wo_a|wo_b)$", "FP8_BLOCK"], ["re:.*ffn.*(gate|up|down)_proj$", "NVFP4"]]
    d = declaration(src)
    assert d.algorithm("layers.3.attn.wq_b") == "FP8_BLOCK"
    assert d.algorithm("layers.3.ffn.experts.7.down_proj") == "NVFP4"
    assert d.algorithm("layers.3.ffn.gate") is None and d.algorithm("head") is None


@pytest.mark.parametrize("edit, said", [
    (lambda g: g["group_0"].update(format="int-quantized"), "int-quantized"),
    (lambda g: g["group_0"]["weights"].update(strategy="channel"), "float-quantized"),
    (lambda g: g["group_1"]["weights"].update(group_size=32), "nvfp4-pack-quantized"),
    (lambda g: g["group_0"]["weights"].update(block_structure=[64, 128]), "float-quantized"),
    (lambda g: g["group_0"].update(format="\n" + "x" * 10**6), "'\\nxxx"),  # hostile: escaped, and cut short
])
def test_a_group_scheme_the_tool_cannot_read_is_refused_in_one_line(capsys, tmp_path, edit, said):
    qc = copy.deepcopy(read_json(REAL)["quantization_config"])
    edit(qc["config_groups"])
    src = write(tmp_path / "bad", qc)
    code, _, err = run_captured(capsys, "inspect", src)
    assert code == 2 and err.count("\n") == 1 and said in err and "config_groups" in err and len(err) < 1000, err[:300]


@pytest.fixture(scope="module")
def dsv4(tmp_path_factory) -> Path:
    from tools.dsv4_fixture import write as write_dsv4

    return write_dsv4(tmp_path_factory.mktemp("dsv4") / "ct")


def doctor_json(capsys, folder: Path, *args) -> tuple[int, dict]:
    code, out, _ = run_captured(capsys, "doctor", folder, "--json", *args)
    return code, json.loads(out)


def test_doctor_reads_each_layer_as_its_group_scheme(capsys, dsv4):
    code, report = doctor_json(capsys, dsv4)
    assert code == 0, [f["message"] for f in report["findings"]]
    schemes = report["schemes"]
    assert {schemes[f"layers.1.attn.{p}"] for p in ("fused_wqa_wkv", "wq_b", "wo_a", "wo_b")} == {"fp8_block"}
    assert {schemes[f"layers.0.ffn.shared_experts.{p}"] for p in ("gate_up_proj", "down_proj")} == {"nvfp4"}
    assert schemes["layers.0.ffn.gate"] == schemes["head"] == "bf16"


def _without(src: Path, dst: Path, tensor: str) -> Path:
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    (dst / "config.json").write_text((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    del tensors[tensor]
    save_file(tensors, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize("tensor, module", [
    ("layers.0.attn.wq_b.weight_scale", "layers.0.attn.wq_b"),  # an FP8 block layer needs its block scales
    ("layers.1.ffn.shared_experts.down_proj.input_global_scale", "layers.1.ffn.shared_experts.down_proj"),  # NVFP4 W4A4
])
def test_a_tensor_the_layers_scheme_needs_is_an_error(capsys, dsv4, tmp_path, tensor, module):
    code, report = doctor_json(capsys, _without(dsv4, tmp_path / "broken", tensor))
    assert code == 1 and any(f["severity"] == "error" and module in f["subject"] for f in report["findings"]), report["findings"]


def test_fix_dequantizes_an_nvfp4_layer_and_copies_the_fp8_block_layers(capsys, dsv4, tmp_path):
    from safetensors import safe_open

    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "r"\n[[rules]]\naction = "dequantize"\nmodules = ["layers.0.ffn.shared_experts.down_proj"]\n')
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", dsv4, "-o", out, "--recipe", recipe, "--quiet")
    assert code == 0, err
    with safe_open(str(out / "model.safetensors"), "pt") as f, safe_open(str(dsv4 / "model.safetensors"), "pt") as g:
        assert f.get_tensor("layers.0.ffn.shared_experts.down_proj.weight").dtype.is_floating_point
        for name in g.keys():
            if ".attn." in name:
                assert f.get_tensor(name).view(-1).view(dtype=__import__("torch").uint8).equal(
                    g.get_tensor(name).view(-1).view(dtype=__import__("torch").uint8)), name
    assert doctor_json(capsys, out)[0] == 0


def test_an_fp8_block_layer_is_dequantized_as_each_code_times_its_block_scale(capsys, dsv4, tmp_path):
    """--target bf16: an FP8 block layer becomes BF16 as compressed-tensors dequantizes its block strategy (the code
    in float32 times its block's float32 scale, cast once: codec/fp8_block.py); it had been refused in one line."""
    import torch
    from safetensors import safe_open

    out = tmp_path / "bf16"
    code, _, err = run_captured(capsys, "fix", dsv4, "-o", out, "--target", "bf16", "--quiet")
    assert code == 0, err
    with safe_open(out / "model.safetensors", "pt") as fh, safe_open(dsv4 / "model.safetensors", "pt") as src:
        assert "layers.0.attn.wq_b.weight_scale" not in fh.keys()
        scale = src.get_tensor("layers.0.attn.wq_b.weight_scale").repeat_interleave(128, 0).repeat_interleave(128, 1)
        expected = (src.get_tensor("layers.0.attn.wq_b.weight").float() * scale).to(torch.bfloat16)
        assert torch.equal(fh.get_tensor("layers.0.attn.wq_b.weight"), expected)
    code, _, err = run_captured(capsys, "doctor", out, "--target", "bf16", "--strict")
    assert code == 0, err


def test_an_fp8_block_layer_built_fp8_block_keeps_its_block_scales_under_sglang(capsys, dsv4):
    """SGLang 0.5.23's CompressedTensorsW8A8Fp8 (block) registers `weight` and `weight_scale`: nothing is skipped."""
    _, report = doctor_json(capsys, dsv4, "--target", "sglang==0.5.23")
    assert report["schemes"]["layers.0.attn.wq_b"] == "fp8_block"
    assert not [f for f in report["findings"] if ".attn." in f["subject"] and f["severity"] == "error"], report["findings"]


@pytest.mark.parametrize("value", [[1, 2], "compressed-tensors", 7, False, []])
@pytest.mark.parametrize("command", [("doctor",), ("inspect",), ("fix", "-o", "OUT", "--target", "sglang==0.5.23")])
def test_a_quantization_config_that_is_not_an_object_is_refused_in_one_line(capsys, dsv4, tmp_path, value, command):
    """Tensors named `weight_packed` claim compressed-tensors; a config.json whose quantization_config is a list,
    string or number is bad input: one line, exit 2, never a traceback."""
    import os

    src = tmp_path / "src"
    src.mkdir()
    os.link(dsv4 / "model.safetensors", src / "model.safetensors")
    config = read_json(dsv4 / "config.json") | {"quantization_config": value}
    (src / "config.json").write_text(json.dumps(config))
    args = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    code, _, err = run_captured(capsys, args[0], src, *args[1:])
    assert code == 2 and err.count("\n") == 1 and "quantization_config" in err, err
    assert not (tmp_path / "out").exists()
