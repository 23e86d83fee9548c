"""`doctor` after any `fix` agrees with what `fix` wrote (issue 18): every built-in recipe on every fixture.

Fixtures: the tiny checkpoints with published NVFP4 models' real configs and names (tools/real_fixture.py),
real ModelOpt exports of a tiny Llama and Qwen3-MoE (tools/modelopt_export.py), and the Gemma 4 assistant
exports the other tests share (tests/conftest.py). For each recipe the fixture accepts, `fix` writes OUT and
`doctor --strict --json` for the recipe's target (the newest known vLLM where the recipe names none) must not
contradict it: no exclusion `fix` added is "unused", no module `fix` changed or excluded has a finding, and no
finding is new (doctor after is a subset of doctor before). A recipe with a target keeps `--target`'s promise (issue
25.6): doctor --strict after is clean, or planning refused with one line (DeepSeek-R1's unused exclusions and
Llama 3.1's siblings' different global scales are findings no target's repair settles: they were written and left).
"""

from __future__ import annotations

import json

import pytest

from repair import api
from repair.errors import BadInput, UsageError
from repair.planning.recipe import builtin_recipes
from repair.targets.profiles import NEWEST_KNOWN
from tests.conftest import LLAMA_31, run_captured
from tools.modelopt_export import export_tiny_qwen3_moe
from tools.real_fixture import REAL_MODELS

FIXTURES = (*REAL_MODELS, LLAMA_31, "modelopt-llama", "modelopt-qwen3-moe", "gemma4-assistant-broken", "gemma4-assistant-correct")
RECIPES = tuple(builtin_recipes())


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory, real_models, llama31, modelopt_llama, broken_export, correct_export) -> dict:
    out = {**real_models, LLAMA_31: llama31, "modelopt-llama": modelopt_llama}
    out["modelopt-qwen3-moe"] = export_tiny_qwen3_moe(tmp_path_factory.mktemp("doctor_after_fix") / "modelopt-qwen3-moe")
    out["gemma4-assistant-broken"], out["gemma4-assistant-correct"] = broken_export, correct_export
    return out


def doctor(capsys, folder, target: str) -> dict:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--strict", "--json")
    assert code in (0, 1), err
    return json.loads(out)


@pytest.mark.parametrize("recipe", RECIPES)
@pytest.mark.parametrize("fixture", FIXTURES)
def test_doctor_after_fix_agrees_with_what_fix_wrote(fixtures, tmp_path, capsys, fixture, recipe):
    src = fixtures[fixture]
    try:
        plan = api.plan(src, recipe)
    except UsageError as err:  # the recipe does not apply here: refused, with one line saying why, before writing
        assert "\n" not in str(err) and any(why in str(err) for why in ("no module matches", "leaves")), err
        pytest.skip(f"{recipe} does not apply to {fixture}")
    except BadInput as err:  # a target's promise it cannot keep: refused before writing
        assert "\n" not in str(err) and "cannot repair" in str(err) and builtin_recipes()[recipe].target, err
        return
    if plan.is_noop:
        pytest.skip(f"{recipe} changes nothing in {fixture}")
    target = plan.recipe.from_target or NEWEST_KNOWN
    before = doctor(capsys, src, target)
    api.run(plan, tmp_path / "out")
    after = doctor(capsys, tmp_path / "out", target)
    added = set(plan.exclusions_added)
    changed = {c.module for c in plan.changes}
    found = [(f["code"], f["subject"]) for f in after["findings"]]
    assert not [f for f in found if f[0] == "unused-exclusion" and f[1] in added], found
    assert not [f for f in found if f[1] in changed], found
    assert set(found) <= {(f["code"], f["subject"]) for f in before["findings"]}, found
    if plan.recipe.from_target:
        assert not found, found
