"""Recipes: built-ins on fixtures, malformed files, reproducing a repair from its report, packaging."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

from repair.demo.examples import GEMMA4_31B, write_assistant
from repair.planning.recipe import Recipe, builtin_recipes, load_recipe, recipe_from_dict
from tests.conftest import load_tensors, raw_bytes, run_cli, tree_hashes
from tools.modelopt_export import modelopt_dequantize

DIMS = GEMMA4_31B.__class__(**{**GEMMA4_31B.__dict__, "vocab": 1024})
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    return write_assistant(tmp_path_factory.mktemp("r") / "broken", DIMS)


def test_builtins_are_listed(capsys):
    assert run_cli("recipes") == 0
    listed = capsys.readouterr().out
    for name in ("gemma4-assistant-vllm-0.25", "gemma4-assistant-vllm-0.21-0.24", "gemma4-assistant-bf16", "modelopt-dequantize-mlp"):
        assert name in listed and name in builtin_recipes()


@pytest.mark.parametrize("name,target", [
    ("gemma4-assistant-vllm-0.25", "vllm==0.25.0"),
    ("gemma4-assistant-vllm-0.21-0.24", "vllm==0.22.1"),
    ("gemma4-assistant-bf16", "bf16"),
])
def test_gemma_builtins_make_doctor_clean(broken, tmp_path, name, target):
    out = tmp_path / "out"
    assert run_cli("fix", broken, "-o", out, "--recipe", name, "--quiet") == 0
    assert run_cli("doctor", out, "--target", target, "--strict") == 0
    assert run_cli("doctor", broken, "--target", target, "--strict") == 1


def test_generic_builtin_on_a_modelopt_llama(tmp_path, modelopt_llama):
    src = modelopt_llama
    out = tmp_path / "out"
    assert run_cli("fix", src, "-o", out, "--recipe", "modelopt-dequantize-mlp", "--quiet") == 0
    before, after = load_tensors(src), load_tensors(out)
    mlp = [f"model.layers.{i}.mlp.{p}" for i in range(2) for p in ("gate_proj", "up_proj", "down_proj")]
    for m in mlp:
        want = modelopt_dequantize(before[f"{m}.weight"], before[f"{m}.weight_scale"], before[f"{m}.weight_scale_2"])
        assert torch.equal(after[f"{m}.weight"].view(torch.int16), want.view(torch.int16))
        assert f"{m}.weight_scale" not in after
    assert after["model.layers.0.self_attn.q_proj.weight"].dtype == torch.uint8  # attention stays NVFP4
    ignore = json.loads((out / "config.json").read_text())["quantization_config"]["ignore"]
    exclude = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert set(mlp) <= set(ignore) and ignore == exclude


@pytest.mark.parametrize("text,message", [
    ('name = "x"\ncolour = "red"\n', "recipe.toml:2: unknown key 'colour'"),
    ('[[rules]]\naction = "melt"\nmodules = ["x"]\n', "rules[0]: 'action' must be one of"),
    ('[[rules]]\naction = "dequantize"\nmodules = []\n', "rules[0]: 'modules' must be a non-empty list"),
    ('drop_quantization = "yes"\n', "recipe.toml:1: 'drop_quantization' must be a bool"),
    ('name = \n', "invalid TOML"),
    ('import os\nos.system("touch /tmp/pwned")\n', "invalid TOML"),
])
def test_malformed_recipe_files_name_the_key(tmp_path, capsys, broken, text, message):
    path = tmp_path / "recipe.toml"
    path.write_text(text)
    assert run_cli("fix", broken, "-o", tmp_path / "out", "--recipe", path) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "out").exists()


def test_recipe_round_trips_through_its_dict():
    recipe = Recipe(name="x", dequantize=("a", "re:b.*"), requantize=("c",), keep=("d",), target="bf16", drop_quantization=True)
    assert recipe_from_dict(json.loads(json.dumps(recipe.as_dict()))) == recipe


@pytest.mark.parametrize("flags", [(), ("--target", "vllm==0.22.1"), ("--recipe", "gemma4-assistant-vllm-0.25")])
def test_reproducing_from_the_report_gives_identical_bytes(broken, tmp_path, flags):
    first, second = tmp_path / "first", tmp_path / "second"
    assert run_cli("fix", broken, "-o", first, "--quiet", *flags) == 0
    assert run_cli("fix", broken, "-o", second, "--quiet", "--recipe", first / "repair_report.json") == 0
    assert tree_hashes(first) == tree_hashes(second)
    assert load_recipe(first / "repair_report.json") == load_recipe(second / "repair_report.json")


def test_python_api_returns_values(broken, tmp_path, capsys):
    import repair

    plan = repair.plan(broken, "gemma4-assistant-vllm-0.25")
    assert {c.module for c in plan.changes} == {"pre_projection", "post_projection"}
    result = repair.run(plan, tmp_path / "out")
    assert capsys.readouterr().out == ""
    assert result.report["doctor"]["after"]["exit_code"] == 0
    got = load_tensors(result.out)
    assert got["pre_projection.weight"].dtype == torch.bfloat16
    assert raw_bytes(got["model.norm.weight"]) == raw_bytes(load_tensors(broken)["model.norm.weight"])


def test_builtin_recipes_ship_in_the_wheel(tmp_path):
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp_path), str(REPO)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for recipe in builtin_recipes():
        assert f"repair/recipes/{recipe}.toml" in names


@pytest.mark.parametrize("flags", [["--requantize", "no_such_module"], ["--requantize", "pre_projecton"]])
def test_a_requantize_that_matches_nothing_is_refused_with_a_target_too(broken, tmp_path, capsys, flags):
    """--target derives only dequantize patterns; the user's own --requantize was silently ignored under it."""
    capsys.readouterr()
    code = run_cli("fix", broken, "-o", tmp_path / "out", "--target", "vllm==0.25.0", *flags, "--quiet")
    err = capsys.readouterr().err
    assert code == 2 and "no module matches" in err and flags[1] in err, err
    assert not (tmp_path / "out").exists()
