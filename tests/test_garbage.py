"""Values that would make garbage are refused before anything is written: scales whose product overflows the
output dtype (at plan time from the scale bytes, and again on the computed output), NaN/inf in tensors taken
from --original, and an --original that reproduces too few modules."""

from __future__ import annotations

import json
import os
import shutil
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

import repair
from repair.errors import BadInput
from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_cli, tree_hashes
from tools.malformed import build
from tools.modelopt_export import save_original


def test_doctor_reports_a_global_scale_that_overflows_bf16(tmp_path, capsys):
    case = build("scale_2_overflows_bf16", tmp_path)
    assert run_cli("doctor", case.src, "--json") == 1
    findings = json.loads(capsys.readouterr().out)["findings"]
    overflow = [f for f in findings if f["code"] == "scale-overflow"]
    assert [f["subject"] for f in overflow] == ["pre_projection.weight_scale_2"] and overflow[0]["severity"] == "error"


def test_the_computed_output_is_checked_too(tmp_path):
    """A scale changed after planning (another program writing the file) is caught on the computed values."""
    src = write_assistant(tmp_path / "src", TINY)
    plan = repair.plan(src, "gemma4-assistant-vllm-0.25")
    shard, info = plan.source.locate()["pre_projection.weight_scale_2"]
    with open(shard.path, "r+b") as fh:
        os.pwrite(fh.fileno(), struct.pack("<f", 3e38), info.start)
    # the writer asks the plan's scale check again (codec/scale_values.py) before its guard on the computed values
    with pytest.raises(BadInput, match=r"pre_projection\.weight_scale_2: .*past BF16's largest finite value"):
        repair.run(plan, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "OUT or a temp folder was left"


def _original_with(original_model, folder, edit) -> str:
    shutil.copytree(original_model, folder)
    file = next(folder.glob("*.safetensors"))
    state = load_file(file)
    edit(state)
    save_file(state, file, metadata={"format": "pt"})
    return folder


def test_an_original_with_a_nan_layer_is_refused_even_with_force(broken_export, original_model, tmp_path, capsys):
    nan_orig = _original_with(original_model, tmp_path / "nan-orig",
                              lambda s: s["post_projection.weight"].fill_(float("nan")))
    before = tree_hashes(nan_orig)
    for extra in ((), ("--force",)):
        assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", nan_orig, "--quiet", *extra) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "post_projection.weight: holds NaN or infinite values" in err
    assert not (tmp_path / "out").exists() and tree_hashes(nan_orig) == before


def test_an_original_reproducing_only_one_module_is_refused(broken_export, original_model, tmp_path, capsys):
    other = load_file(next(save_original(tmp_path / "other-seed", seed=7).glob("*.safetensors")))
    mostly_other = _original_with(original_model, tmp_path / "mostly-other",
                                  lambda s: s.update({k: v for k, v in other.items() if not k.startswith("pre_projection")}))
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", mostly_other, "--quiet") == 2
    err = capsys.readouterr().err
    assert "not the original of" in err and "original verified: 1 of 12 modules reproduce" in err
    assert not (tmp_path / "out").exists()
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", mostly_other, "--quiet", "--force") == 0
    report = json.loads((tmp_path / "out" / "repair_report.json").read_text())["original"]
    assert report["verified"] == 1 and report["checked"] == 12 and report["forced"]


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bool])
def test_an_original_weight_that_is_not_float_data_counts_as_not_reproducing(broken_export, original_model, tmp_path, capsys, dtype):
    """A module the repair does not take, stored in ORIG as FP8 or bool: one module fails verification
    (it was a traceback: torch has no isfinite/abs for these dtypes)."""
    name = "model.layers.0.mlp.down_proj.weight"
    odd = _original_with(original_model, tmp_path / "odd", lambda s: s.update({name: s[name].to(dtype)}))
    code = run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", odd, "--quiet")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "original verified: 11 of 12" in out
    assert "Traceback" not in err


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bool, torch.int32])
def test_a_taken_original_weight_that_is_not_float_data_is_refused(broken_export, original_model, tmp_path, capsys, dtype):
    odd = _original_with(original_model, tmp_path / "odd", lambda s: s.update({"post_projection.weight": s["post_projection.weight"].to(dtype)}))
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", odd, "--quiet", "--force") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "post_projection.weight" in err and "not a floating-point tensor" in err, err
    assert not (tmp_path / "out").exists()


def test_an_original_weight_past_float32_is_not_a_nan_in_the_report_nor_said_to_be_taken(broken_export, original_model, tmp_path, capsys):
    """F64 values of 1e300 are finite, but not in float32 or BF16: the module does not reproduce; the report stays
    strict JSON (no NaN), and the summary says a module the recipe keeps is kept, not 'taken from the original'."""
    name = "model.layers.0.mlp.down_proj.weight"
    big = _original_with(original_model, tmp_path / "big", lambda s: s.update({name: s[name].double() * 1e300}))
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", big, "--quiet") == 0
    out = capsys.readouterr().out
    text = (tmp_path / "out" / "repair_report.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"report holds {c}"))
    assert "original verified: 11 of 12" in out
    assert not any("down_proj" in line and "taken from the original" in line for line in out.splitlines()), out


def test_a_corrupted_module_the_recipe_keeps_is_not_said_to_be_taken(broken_export, original_model, tmp_path, capsys):
    """The summary said 'taken from the original' for every module far from ORIG, while the plan keeps the
    checkpoint's copy of those it does not take: the output's bytes must match what the line says."""
    name = "model.layers.0.mlp.down_proj.weight"
    far = _original_with(original_model, tmp_path / "far", lambda s: s.update({name: -s[name]}))
    assert run_cli("fix", broken_export, "-o", tmp_path / "out", "--original", far, "--quiet") == 0
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "model.layers.0.mlp.down_proj:" in line)
    assert "(corrupted)" in line and "taken from the original" not in line and "kept" in line, out
    kept = load_file(tmp_path / "out" / "model.safetensors")[name]
    stored = load_file(next(broken_export.glob("*.safetensors")))[name]
    assert torch.equal(kept, stored)
