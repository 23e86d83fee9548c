"""Fuzz recipes, as TOML text and as report JSON: loading and planning one either works or fails with
the tool's own one-line error, and neither the recipe file nor the checkpoint is ever changed.

Recipes are built near-valid (real keys and actions, module patterns that are names, globs or
`re:` regexes, some broken) and then written as TOML or as a repair_report.json, or taken as raw
mutated text of a built-in recipe, so both the parsers and the planner's pattern matching are hit.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from repair.errors import RepairError
from repair.io.checkpoint import open_checkpoint
from repair.planning.build import make_plan
from repair.planning.recipe import ACTIONS, load_recipe

FAST = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
                database=None)
BUILTIN = (Path(__file__).resolve().parents[1] / "recipes" / "gemma4-assistant-vllm-0.25.toml").read_text()

scalars = st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=10)
values = st.recursive(scalars, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=8)
patterns = (st.sampled_from(["pre_projection", "post_projection", "model.layers.*.mlp.*", "re:.*_proj", "re:(", "re:[a-", "re:a{99999999999}",
                             "re:(?P<x>a)(?P=y)", "", "*", "re:.*\\.mlp\\.(gate|up)_proj"])
            | st.text(max_size=12) | st.text(max_size=12).map(lambda t: "re:" + t))
rules = st.fixed_dictionaries({"action": st.sampled_from(ACTIONS) | st.text(max_size=8), "modules": st.lists(patterns, max_size=3) | patterns}) | values
recipes = st.fixed_dictionaries({}, optional={
    "name": st.text(max_size=10) | values, "description": st.text(max_size=10), "dtype": st.sampled_from(["bf16", "F16", "f32", "int4"]) | values,
    "drop_quantization": st.booleans() | values, "target": st.sampled_from(["vllm==0.25.0", "vllm==0.22.1", "bf16", "vllm==", "x"]) | values,
    "rules": st.lists(rules, max_size=3) | values, "extra": values})


def toml_value(value) -> str:
    """A TOML literal for JSON-like data (TOML's basic strings take JSON's escapes); None has none, so it is an empty table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return json.dumps(value)  # nan/inf come out as NaN/Infinity: invalid TOML, which is a fine input too
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return "{}"


def as_toml(recipe: dict) -> str:
    lines = [f"{json.dumps(k)} = {toml_value(v)}" for k, v in recipe.items() if k != "rules"]
    rule_list = recipe.get("rules")
    if isinstance(rule_list, list) and all(isinstance(r, dict) for r in rule_list):
        for rule in rule_list:
            lines += ["[[rules]]"] + [f"{json.dumps(k)} = {toml_value(v)}" for k, v in rule.items()]
    elif "rules" in recipe:
        lines.insert(0, f"rules = {toml_value(rule_list)}")
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def checkpoint():
    from repair.demo.examples import TINY, write_assistant

    folder = Path(tempfile.mkdtemp(prefix="fuzz-recipes-"))
    src = write_assistant(folder / "src", TINY, broken=True)
    yield src
    shutil.rmtree(folder, ignore_errors=True)


def digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def load_and_plan(src: Path, recipe_file: Path) -> None:
    """Load the recipe and plan with it; only the tool's own one-line errors may escape."""
    before = digest(src), recipe_file.read_bytes()
    try:
        make_plan(open_checkpoint(src), load_recipe(recipe_file))
    except RepairError as err:
        assert str(err) and "\n" not in str(err), repr(err)
    assert (digest(src), recipe_file.read_bytes()) == before, "an input was changed"


@FAST
@given(recipe=recipes)
def test_toml_recipes(checkpoint, tmp_path_factory, recipe):
    path = tmp_path_factory.mktemp("r") / "recipe.toml"
    path.write_text(as_toml(recipe), encoding="utf-8", errors="surrogatepass")
    load_and_plan(checkpoint, path)


@FAST
@given(recipe=recipes | values, wrap=st.booleans())
def test_report_json_recipes(checkpoint, tmp_path_factory, recipe, wrap):
    path = tmp_path_factory.mktemp("r") / "repair_report.json"
    path.write_text(json.dumps({"recipe": recipe} if wrap else recipe), encoding="utf-8")
    load_and_plan(checkpoint, path)


@FAST
@given(at=st.integers(0, len(BUILTIN)), cut=st.integers(0, 8), insert=st.binary(max_size=6))
def test_mutated_builtin_recipe_text(checkpoint, tmp_path_factory, at, cut, insert):
    path = tmp_path_factory.mktemp("r") / "recipe.toml"
    raw = BUILTIN.encode()
    path.write_bytes(raw[:at] + insert + raw[at + cut:])
    load_and_plan(checkpoint, path)
