"""Recipe rules that select by stored algorithm (`algorithm = "FP8"`, "W4A16_NVFP4", ...), parsed and run through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from repair.errors import UsageError
from repair.planning.recipe import Action, AlgorithmRule, recipe_from_dict
from tests.conftest import read_json, run_captured
from tests.mixed_helpers import healthy_layers, write_mixed
from tests.test_fix_mixed import assert_dequantized_like_modelopt, bits, load

ALLOWED = "use one of NVFP4, W4A16_NVFP4, NVFP4_AWQ, FP8"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("recipes-algo") / "healthy")


def test_rules_parse_one_or_several_algorithms_in_any_case_and_round_trip():
    recipe = recipe_from_dict({"rules": [{"action": "dequantize", "algorithm": "fp8"},
                                         {"action": "keep", "modules": ["*.experts.*"], "algorithm": ["W4A16_NVFP4", "nvfp4_awq"]}]})
    assert recipe.by_algorithm == (AlgorithmRule(Action.DEQUANTIZE, ("FP8",), ("*",)),
                                   AlgorithmRule(Action.KEEP, ("W4A16_NVFP4", "NVFP4_AWQ"), ("*.experts.*",)))
    assert recipe.dequantize == () and recipe.keep == ()
    assert recipe_from_dict(recipe.as_dict()) == recipe
    assert recipe.using_original().by_algorithm[0].action == Action.TAKE_ORIGINAL


@pytest.mark.parametrize("value, shown", [("MXFP4", "'MXFP4'"), (["FP8", "int4_awq"], "'int4_awq'"), ([3], "3")])
def test_an_unknown_algorithm_is_one_line_naming_it_and_the_allowed_ones(value, shown):
    with pytest.raises(UsageError) as err:
        recipe_from_dict({"rules": [{"action": "dequantize", "modules": ["*"], "algorithm": value}]})
    assert str(err.value) == f"recipe: rules[0]: 'algorithm' {shown} is not a stored algorithm this tool knows; {ALLOWED}"


@pytest.mark.parametrize("value", [[], {"a": 1}, 4])
def test_an_algorithm_of_the_wrong_type_is_refused(value):
    with pytest.raises(UsageError, match=r"'algorithm' must be one of NVFP4, W4A16_NVFP4, NVFP4_AWQ, FP8 or a list of them"):
        recipe_from_dict({"rules": [{"action": "dequantize", "algorithm": value}]})


def write_recipe(folder: Path, text: str) -> Path:
    path = folder / "r.toml"
    path.write_text('name = "by-algorithm"\n' + text)
    return path


def test_dequantize_every_w4a16_mlp_layer(capsys, healthy, tmp_path):
    """The issue's example, "dequantize every W4A16_NVFP4 expert": a pattern and an algorithm together."""
    recipe = write_recipe(tmp_path, '[[rules]]\naction = "dequantize"\nmodules = ["*.mlp.*"]\nalgorithm = "W4A16_NVFP4"\n')
    code, text, err = run_captured(capsys, "fix", healthy, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 0, err
    assert "recipe by-algorithm changes 2 module(s): dequantize 2" in text
    done = {m: "W4A16_NVFP4" for m in ("model.layers.1.mlp.gate_proj", "model.layers.1.mlp.up_proj")}
    src, out = load(healthy), load(tmp_path / "out")
    assert_dequantized_like_modelopt(src, out, done)
    for name in src:
        if not any(name.startswith(m + ".") for m in done):
            assert bits(out[name]).equal(bits(src[name])), name
    config = read_json(tmp_path / "out" / "config.json")["quantization_config"]
    assert set(config["quantized_layers"]) == set(healthy_layers()) - set(done)
    assert config["ignore"] == []  # taken out of quantized_layers, not excluded
    assert "quantized_layers: take out model.layers.1.mlp.gate_proj, model.layers.1.mlp.up_proj" in text
    code, doctor_text, _ = run_captured(capsys, "doctor", tmp_path / "out", "--strict")
    assert code == 0, doctor_text


def test_keep_by_algorithm_wins_over_a_broader_dequantize(capsys, healthy, tmp_path):
    recipe = write_recipe(tmp_path, '[[rules]]\naction = "keep"\nalgorithm = "FP8"\n[[rules]]\naction = "dequantize"\nmodules = ["*"]\n')
    code, text, err = run_captured(capsys, "fix", healthy, "-o", tmp_path / "out", "--recipe", recipe, "--dry-run")
    assert code == 0, err
    changed = {line.split(":")[0].strip() for line in text.splitlines() if line.startswith("  model.") and ": dequantize" in line}
    assert changed == {m for m, a in healthy_layers().items() if a != "FP8"}


def test_a_rule_matching_no_module_of_its_algorithm_says_so(capsys, healthy, tmp_path):
    recipe = write_recipe(tmp_path, '[[rules]]\naction = "dequantize"\nmodules = ["*.self_attn.*"]\nalgorithm = "NVFP4_AWQ"\n')
    code, _, err = run_captured(capsys, "fix", healthy, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and err == (f"error: {healthy}: no module stored as NVFP4_AWQ matches *.self_attn.* (dequantize); "
                                 "run `ckpt-repair inspect` to see the modules and their algorithms\n")


def test_an_unknown_algorithm_in_a_recipe_file_is_exit_2_with_its_line(capsys, healthy, tmp_path):
    recipe = write_recipe(tmp_path, '[[rules]]\naction = "dequantize"\nalgorithm = "MXFP4"\n')
    code, _, err = run_captured(capsys, "fix", healthy, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and err == f"error: {recipe}:4: rules[0]: 'algorithm' 'MXFP4' is not a stored algorithm this tool knows; {ALLOWED}\n"
