"""Requantizing FP8 per-tensor layers from the original BF16 model: byte-identical to ModelOpt's FP8 export.

The checkpoint is tests/mixed_helpers' MIXED_PRECISION model; its original is the same seed's BF16
weights. The oracle is ModelOpt's own FP8_DEFAULT_CFG quantization and HF export, each layer with its own amax: the
export's _fuse_shared_input_modules skips FP8 per-tensor groups (q/k/v keep their own weight_scale; a whole-model export
checks it in tests/test_modelopt_shared_inputs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import read_json, run_captured
from tests.mixed_helpers import healthy_layers, llama_config, tensors_for, write_mixed
from tests.test_fix_mixed import bits, load
from tools.modelopt_oracles import fp8_export

ATTN0 = [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("orig") / "original"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(llama_config()))
    save_file(tensors_for({}, kv=False), str(folder / "model.safetensors"))  # same seed: the weights the checkpoint quantized
    return folder


def broken(folder: Path) -> Path:
    """The healthy model with layer 0's q_proj FP8 bytes zeroed (what --original repairs)."""
    tensors = tensors_for(healthy_layers())
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = torch.zeros_like(tensors[name].view(torch.uint8)).view(torch.float8_e4m3fn)
    return write_mixed(folder, tensors=tensors)


def modelopt_fp8(original: dict[str, torch.Tensor], module: str) -> dict[str, torch.Tensor]:
    return fp8_export(original[f"{module}.weight"])


def test_requantize_fp8_attention_byte_identical_to_modelopt(capsys, original, tmp_path):
    src = broken(tmp_path / "src")
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "fp8-attn"\n[[rules]]\naction = "requantize"\nmodules = ["model.layers.0.self_attn.*"]\nalgorithm = "FP8"\n')
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--original", original, "--recipe", recipe)
    assert code == 0, err
    assert "model.layers.0.self_attn.q_proj: requantize from the original -> fp8 [64, 64] (was f8_e4m3 [64, 64])" in text
    orig, out, before = load(original), load(tmp_path / "out"), load(src)
    for module in ATTN0:
        theirs = modelopt_fp8(orig, module)
        assert out[f"{module}.weight"].dtype == torch.float8_e4m3fn
        assert torch.equal(bits(out[f"{module}.weight"]), bits(theirs["weight"])), module
        assert torch.equal(bits(out[f"{module}.weight_scale"]), bits(theirs["weight_scale"])), module
        assert torch.equal(bits(out[f"{module}.input_scale"]), bits(before[f"{module}.input_scale"]))  # activation scale kept
    assert not torch.equal(bits(before["model.layers.0.self_attn.q_proj.weight"]), bits(out["model.layers.0.self_attn.q_proj.weight"]))
    for name in before:
        if not any(name.startswith(m + ".") for m in ATTN0):
            assert torch.equal(bits(out[name]), bits(before[name])), name
    assert read_json(tmp_path / "out" / "config.json") == read_json(src / "config.json")  # FP8 stays declared FP8
    code, doctor_out, _ = run_captured(capsys, "doctor", tmp_path / "out", "--strict", "--json")
    found = [(f["code"], f["subject"]) for f in json.loads(doctor_out)["findings"]]
    assert (code, found) == (1, [("runtime-scheme", "model.layers.1.mlp.down_proj")])  # only the NVFP4_AWQ layer vLLM 0.32 cannot build, as before


def test_the_original_is_verified_on_fp8_and_nvfp4_layers(capsys, original, tmp_path):
    """--original is checked by reproducing stored bytes: FP8 layers with their scale, NVFP4 with theirs (AWQ skipped)."""
    src = broken(tmp_path / "src")
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--original", original, "--target", "bf16")
    assert code == 0, err
    report = read_json(tmp_path / "out" / "repair_report.json")
    assert report["original"]["verified"] == 12 and report["original"]["mismatched"] == ["model.layers.0.self_attn.q_proj"]


def test_requantizing_nvfp4_awq_is_refused(capsys, original, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "awq"\n[[rules]]\naction = "requantize"\nalgorithm = "NVFP4_AWQ"\n')
    src = write_mixed(tmp_path / "src")
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--original", original, "--recipe", recipe)
    assert code == 2 and err == (f"error: {src}: model.layers.1.mlp.down_proj: requantizing NVFP4_AWQ needs ModelOpt's AWQ calibration "
                                 "(its pre_quant_scale comes from activations); dequantize the module or keep it\n")
