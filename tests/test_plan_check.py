"""The plan check and internal errors (issue 15): a plan the writer would refuse never gets past
planning, a failed check of our own output is exit 3 with one line that blames ckpt-repair, and
shards that lose every tensor are left out of OUT, its index and total_size."""

from __future__ import annotations

import dataclasses
import json
import types

import pytest

import repair
import repair.planning.check
import repair.planning.build
from repair.errors import InternalError
from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured, tree_hashes

SHARDS = [["pre_projection"], ["post_projection"]]  # shard 1 untouched, 2 and 3 rewritten by the default fix


@pytest.fixture
def src(tmp_path):
    return write_assistant(tmp_path / "src", TINY, shards=SHARDS)


def inject(monkeypatch, corrupt) -> None:
    """Plan with `corrupt(steps)` applied to the real shard steps (a stand-in for a planning bug)."""
    real = repair.planning.build._shard_steps

    def planned(ckpt, changes):
        steps, emptied = real(ckpt, changes)
        return corrupt(list(steps)), emptied

    monkeypatch.setattr(repair.planning.build, "_shard_steps", planned)


def repeat_a_step(steps):
    """The first rewritten shard's first tensor step, written a second time in the same shard."""
    i = next(k for k, s in enumerate(steps) if s.op == "rewrite")
    steps[i] = dataclasses.replace(steps[i], tensors=steps[i].tensors + (steps[i].tensors[0],))
    return tuple(steps)


def outputs_in_two_shards(steps):
    """The bug issue 15 reports: a module's outputs written in its home shard and again in another."""
    first, second = [k for k, s in enumerate(steps) if s.op == "rewrite"][:2]
    moved = [t for t in steps[first].tensors if t.op == "dequantize"]
    steps[second] = dataclasses.replace(steps[second], tensors=steps[second].tensors + tuple(moved))
    return tuple(steps)


def assert_internal_error(code: int, err: str, out, src, before: dict, check: str) -> None:
    assert code == 3, err
    assert err.count("\n") == 1 and err.startswith(f"error: internal error: {check} failed: "), err
    for words in ("a bug in ckpt-repair, not in the input", "nothing was published", "the input is unchanged",
                  "ckpt-repair issue tracker with the command line"):
        assert words in err, (words, err)
    assert "remove" not in err and "delete" not in err and ".partial" not in err, err
    assert not out.exists(), "something was published"
    assert sorted(p.name for p in out.parent.iterdir()) == sorted([src.name]), "a temp folder was left behind"
    assert tree_hashes(src) == before, "the input was modified"


def test_a_plan_edited_after_planning_is_checked_before_the_api_writes(src, tmp_path):
    """repair.run takes any Plan: one changed after repair.plan is refused as ours before anything is written."""
    plan = repair.plan(src)
    bad = dataclasses.replace(plan, shards=repeat_a_step(list(plan.shards)))
    before = tree_hashes(src)
    with pytest.raises(InternalError, match="the plan check failed") as err:
        repair.run(bad, tmp_path / "out")
    assert err.value.exit_code == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "something was written"
    assert tree_hashes(src) == before


def test_a_tensor_step_of_an_unknown_type_is_refused_by_the_plan_check(src, tmp_path):
    """The writer dispatches on a step's type, with no fallback: a step of any other type never reaches it."""
    plan = repair.plan(src)
    shards = list(plan.shards)
    i = next(k for k, s in enumerate(shards) if s.op == "rewrite")
    odd = [types.SimpleNamespace(out=t.out, inputs=t.inputs, source=t.source) if t.op == "dequantize" else t for t in shards[i].tensors]
    shards[i] = dataclasses.replace(shards[i], tensors=tuple(odd))
    with pytest.raises(InternalError, match="a planned tensor is a SimpleNamespace, not one of the tensor steps the writer knows"):
        repair.run(dataclasses.replace(plan, shards=tuple(shards)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dry_run", [False, True])
@pytest.mark.parametrize("corrupt", [repeat_a_step, outputs_in_two_shards])
def test_a_duplicate_in_the_plan_is_an_internal_error_before_anything_is_read(capsys, monkeypatch, src, dry_run, corrupt):
    inject(monkeypatch, corrupt)
    before, out = tree_hashes(src), src.parent / "out"
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet", *(["--dry-run"] if dry_run else []))
    assert_internal_error(code, err, out, src, before, "the plan check")
    assert "is planned twice" in err
    with pytest.raises(InternalError, match="is planned twice"):
        repair.plan(src)  # the Python API runs the same check


@pytest.mark.parametrize("corrupt,check", [
    (repeat_a_step, "the check of the written output"),  # the writer's own re-read of its headers
    (outputs_in_two_shards, "re-opening the written output"),  # doctor-after re-opens OUT: once "remove the stale shard"
])
def test_without_the_plan_check_the_writers_checks_still_blame_the_tool(capsys, monkeypatch, src, corrupt, check):
    inject(monkeypatch, corrupt)
    monkeypatch.setattr(repair.planning.check, "check_plan", lambda plan: None)
    before, out = tree_hashes(src), src.parent / "out"
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--quiet")
    assert_internal_error(code, err, out, src, before, check)


def test_the_tp_layout_is_checked_too(capsys, monkeypatch, src):
    inject(monkeypatch, repeat_a_step)
    monkeypatch.setattr(repair.planning.check, "check_plan", lambda plan: None)
    before, out = tree_hashes(src), src.parent / "out"
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--tp", "2", "--quiet")
    assert_internal_error(code, err, out, src, before, "the plan check")
    assert "--tp 2 layout" in err


def test_a_shard_that_loses_every_tensor_is_not_written(capsys, src, tmp_path):
    recipe = tmp_path / "drop.toml"
    recipe.write_text('name = "drop-post"\n\n[[rules]]\naction = "drop"\nmodules = ["post_projection"]\n')
    emptied = "model-00003-of-00003.safetensors"
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--dry-run")
    assert code == 0, err
    assert f"1 shard(s) not written ({emptied}: every tensor it held moved to another shard or was dropped)" in text
    code, text, _ = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--dry-run", "--json")
    files = json.loads(text)["plan"]["files"]
    assert {"name": emptied, "op": "remove", "why": "every tensor it held moved to another shard or was dropped"} in files
    assert repair.plan(src, recipe).removed_files == (emptied,)  # what `hub fix` deletes from the fork / PR
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, err
    written = sorted(p.name for p in (tmp_path / "out").glob("*.safetensors"))
    assert written == ["model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"]
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(written)
    assert not any(n.startswith("post_projection.") for n in index["weight_map"])
    assert index["metadata"]["total_size"] == sum(
        (p.stat().st_size - 8 - int.from_bytes(p.read_bytes()[:8], "little")) for p in (tmp_path / "out").glob("*.safetensors"))


@pytest.mark.parametrize("sharded", [False, True])
def test_a_recipe_that_drops_every_tensor_is_refused(capsys, tmp_path, sharded):
    """Sharded or a single file without an index: an output with no weights is no checkpoint, so exit 2."""
    import torch
    from safetensors.torch import save_file

    src = tmp_path / "src"
    src.mkdir()
    layers = {f"layers.{i}.proj.weight": torch.ones(4, 4, dtype=torch.bfloat16) for i in range(2)}
    if sharded:
        weight_map = {name: f"model-0000{k + 1}-of-00002.safetensors" for k, name in enumerate(layers)}
        for name, file in weight_map.items():
            save_file({name: layers[name]}, src / file)
        (src / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 64}, "weight_map": weight_map}))
    else:
        save_file(layers, src / "model.safetensors")
    recipe = tmp_path / "drop.toml"
    recipe.write_text('name = "drop-all"\n\n[[rules]]\naction = "drop"\nmodules = ["re:.*"]\n')
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and err.count("\n") == 1 and "drops every tensor, so the output would hold no weights" in err, err
    assert not (tmp_path / "out").exists()


def _twice(m):
    m["standard"]["shards"][1]["tensors"].append(m["standard"]["shards"][0]["tensors"][0])


def _escaping_shard(m):
    m["standard"]["shards"][0]["name"] = "../outside.safetensors"


def _escaping_rank(m):
    m["ranks"][1]["folder"] = "../elsewhere"


@pytest.mark.parametrize("tamper,said", [(_twice, "is listed in two standard shards"),
                                         (_escaping_shard, "has an empty, '.' or '..' component"),
                                         (_escaping_rank, "has an empty, '.' or '..' component")])
def test_unshard_checks_the_manifest_layout_before_writing(capsys, src, tmp_path, tamper, said):
    """The manifest is read from a file, so a wrong layout there is bad input (exit 2), checked before any byte is written."""
    assert run_captured(capsys, "fix", src, "-o", tmp_path / "tp", "--tp", "2", "--quiet")[0] == 0
    path = tmp_path / "tp" / "tp_manifest.json"
    manifest = json.loads(path.read_text())
    tamper(manifest)
    path.write_text(json.dumps(manifest))
    code, _, err = run_captured(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "back")
    assert code == 2 and err.count("\n") == 1 and said in err and "re-run `fix --tp`" in err, err
    assert not (tmp_path / "back").exists() and not (tmp_path / "outside.safetensors").exists()


@pytest.mark.parametrize("real_format", ["modelopt-nvfp4", "compressed-tensors"])
def test_a_plan_holding_another_format_than_its_source_is_refused(tmp_path, real_format):
    """The format decides whether the global scale multiplies or divides: a Plan whose `format` is not its
    source's (built by hand with the default, or edited) would write wrongly scaled weights without a word."""
    from repair.formats import FORMATS
    from tools.real_fixture import write_real_model

    src = write_assistant(tmp_path / "src", TINY) if real_format == "modelopt-nvfp4" else write_real_model(tmp_path / "src", "ct-llama-dense")
    plan = repair.plan(src, "modelopt-dequantize-mlp" if real_format == "compressed-tensors" else repair.planning.recipe.DEFAULT)
    assert plan.format.NAME == real_format and plan.changes
    other = next(f for f in FORMATS if f is not plan.format)
    with pytest.raises(InternalError, match=f"the plan holds format {other.NAME} but its source is stored as {real_format}"):
        repair.run(dataclasses.replace(plan, format=other), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def _as_cast(t):
    return repair.planning.model.Cast(t.out, t.inputs[:1], t.source, t.module)


def _scales_swapped(t):
    return dataclasses.replace(t, inputs=(t.inputs[0], t.inputs[2], t.inputs[1]))


def _as_requantize(t):
    return repair.planning.model.Requantize(t.out, t.inputs[:1], t.source, t.module, role="weight")


@pytest.mark.parametrize("edit", [_as_cast, _scales_swapped, _as_requantize])
def test_a_computed_step_whose_inputs_cannot_make_its_output_is_refused(src, tmp_path, edit):
    """A hand-edited step of the wrong type or with its inputs out of order: refused by the plan check (exit 3) before
    anything is read, not written as garbage nor stopped by a bare AssertionError half-way through a shard."""
    import repair.planning.model

    plan = repair.plan(src)
    shards = list(plan.shards)
    i = next(k for k, s in enumerate(shards) if s.op == "rewrite")
    edited = tuple(edit(t) if t.op == "dequantize" else t for t in shards[i].tensors)
    shards[i] = dataclasses.replace(shards[i], tensors=edited)
    with pytest.raises(InternalError, match="the plan check failed: .* cannot be made from"):
        repair.run(dataclasses.replace(plan, shards=tuple(shards)), tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("edit", [_as_cast, _scales_swapped])
def test_plan_tp_runs_the_plan_check_on_a_hand_built_plan(src, tmp_path, edit):
    """`fix --tp` through the Python side takes any Plan: one edited by hand is refused by the plan check (exit 3)
    before the layout is made or anything is written, as `repair.run` refuses it (issue 25, 10d)."""
    import repair.planning.model
    from repair.tp.plan import plan_tp
    from repair.tp.write import fix_tp

    plan = repair.plan(src)
    shards = list(plan.shards)
    i = next(k for k, s in enumerate(shards) if s.op == "rewrite")
    shards[i] = dataclasses.replace(shards[i], tensors=tuple(edit(t) if t.op == "dequantize" else t for t in shards[i].tensors))
    bad = dataclasses.replace(plan, shards=tuple(shards))
    with pytest.raises(InternalError, match="the plan check failed: .* cannot be made from") as err:
        plan_tp(bad, 2)
    assert err.value.exit_code == 3
    with pytest.raises(InternalError, match="the plan check failed"):
        fix_tp(bad, tmp_path / "out", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"], "something was written"
