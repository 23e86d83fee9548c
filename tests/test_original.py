"""--original: BF16 modules taken from the source model, verified first; requantize exactly like ModelOpt."""

from __future__ import annotations

import json

import torch

from repair.demo.examples import TINY, write_assistant
from tests.conftest import load_tensors, raw_bytes, run_cli
from tools.modelopt_export import modelopt_quantize, save_original


def test_with_original_the_fix_equals_modelopts_correct_export(broken_export, correct_export, original_model, tmp_path, capsys):
    out = tmp_path / "fixed"
    assert run_cli("fix", broken_export, "-o", out, "--original", original_model, "--quiet") == 0
    assert "original verified: 12 of 12 modules reproduce byte-for-byte" in capsys.readouterr().out
    got, want = load_tensors(out), load_tensors(correct_export)
    assert got.keys() == want.keys()
    for name in got:
        assert got[name].dtype == want[name].dtype and raw_bytes(got[name]) == raw_bytes(want[name]), name
    report = json.loads((out / "repair_report.json").read_text())
    assert report["original"]["verified"] == report["original"]["checked"] == 12 and not report["original"]["forced"]
    assert 0.05 < report["original"]["relative_error"]["pre_projection"] < 0.2 and report["original"]["corrupted"] == []
    assert [c["action"] for c in report["changes"]] == ["take_original", "take_original"]


def test_a_different_model_is_refused_and_force_proceeds(broken_export, tmp_path, capsys):
    other = save_original(tmp_path / "other-seed", seed=7)
    out = tmp_path / "fixed"
    capsys.readouterr()
    assert run_cli("fix", broken_export, "-o", out, "--original", other, "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not the original of" in err and "0 of 12" in err and "--force" in err
    assert not out.exists()
    assert run_cli("fix", broken_export, "-o", out, "--original", other, "--force", "--quiet") == 0
    report = json.loads((out / "repair_report.json").read_text())
    assert report["original"]["forced"] and report["original"]["verified"] == 0


def test_an_original_of_another_shape_is_refused_even_with_force(broken_export, tmp_path, capsys):
    other = write_assistant(tmp_path / "bigger", TINY.__class__(**{**TINY.__dict__, "backbone": 128}), broken=False)
    for extra in ((), ("--force",)):
        assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", other, "--quiet", *extra) == 2
        assert "different model" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_requantize_single_modules_byte_identical_to_modelopt(broken_export, original_model, tmp_path):
    out = tmp_path / "requantized"
    assert run_cli("fix", broken_export, "-o", out, "--original", original_model,
                   "--requantize", "pre_projection,post_projection", "--quiet") == 0
    got, orig, src = load_tensors(out), load_tensors(original_model), load_tensors(broken_export)
    for name in ("pre_projection", "post_projection"):
        packed, scale, scale_2 = modelopt_quantize(orig[f"{name}.weight"])
        assert torch.equal(got[f"{name}.weight"], packed)
        assert torch.equal(got[f"{name}.weight_scale"].view(torch.uint8), scale.view(torch.uint8))
        assert torch.equal(got[f"{name}.weight_scale_2"], scale_2.reshape(()))
        assert torch.equal(got[f"{name}.input_scale"], src[f"{name}.input_scale"])  # kept: not derivable from weights
    config = json.loads((out / "config.json").read_text())
    assert "pre_projection" not in config["quantization_config"]["ignore"]


def test_requantize_a_fused_group_shares_one_global_scale(broken_export, original_model, tmp_path):
    out = tmp_path / "requantized"
    assert run_cli("fix", broken_export, "-o", out, "--original", original_model,
                   "--requantize", "model.layers.0.mlp.gate_proj", "--quiet") == 0
    got, orig, src = load_tensors(out), load_tensors(original_model), load_tensors(broken_export)
    gate, up = (orig[f"model.layers.0.mlp.{p}.weight"] for p in ("gate_proj", "up_proj"))
    shared = torch.maximum(modelopt_quantize(gate)[2], modelopt_quantize(up)[2])
    for proj, weight in (("gate_proj", gate), ("up_proj", up)):
        packed, scale, scale_2 = modelopt_quantize(weight, shared)
        prefix = f"model.layers.0.mlp.{proj}"
        assert torch.equal(got[f"{prefix}.weight"], packed) and torch.equal(got[f"{prefix}.weight_scale_2"], scale_2.reshape(()))
        assert torch.equal(got[f"{prefix}.weight"], src[f"{prefix}.weight"])  # and what ModelOpt's export stored


def test_a_corrupted_module_is_flagged(broken_export, original_model, tmp_path, capsys):
    import shutil

    from safetensors.torch import load_file, save_file

    damaged = tmp_path / "damaged"
    shutil.copytree(broken_export, damaged)
    state = load_file(damaged / "model.safetensors")
    state["post_projection.weight"] = torch.zeros_like(state["post_projection.weight"])  # the exporter lost the data
    save_file(state, damaged / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "fixed"
    assert run_cli("fix", damaged, "-o", out, "--original", original_model, "--quiet") == 0
    text = capsys.readouterr().out
    assert "original verified: 11 of 12" in text and "post_projection: its NVFP4 copy is 100% off the original (corrupted)" in text
    report = json.loads((out / "repair_report.json").read_text())
    assert report["original"]["corrupted"] == ["post_projection"] and report["original"]["mismatched"] == ["post_projection"]
    assert raw_bytes(load_tensors(out)["post_projection.weight"]) == raw_bytes(load_tensors(original_model)["post_projection.weight"])
