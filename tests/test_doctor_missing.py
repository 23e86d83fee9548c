"""doctor knows what is missing (issue 25.7): a module the architecture expects but the checkpoint lacks is an error,
and a `drop` rule whose output would lack one is refused under `--target`.

The Gemma 4 assistant has a loader profile (its expected modules come from config.json); a Llama MIXED_PRECISION
checkpoint (tests/mixed_helpers.py) has none, so its decoder layers' common modules are the evidence. Every real
config and fixture checkpoint (tests/data/real, ModelOpt's exports, the Qwen3.6 layout, compressed-tensors) must
stay free of the new finding as exported: hybrid and MoE families differ between layers on purpose.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import save_file

from repair.demo.examples import TINY, write_assistant
from tests.conftest import run_captured
from tests.mixed_helpers import write_mixed
from tools.real_fixture import REAL_MODELS, write_real_model

DOWN = "model.layers.0.mlp.down_proj"


def without(src: Path, dst: Path, module: str) -> Path:
    """A copy of `src` whose shards no longer hold `module`'s tensors (the index follows)."""
    shutil.copytree(src, dst)
    for shard in sorted(dst.glob("*.safetensors")):
        with safe_open(shard, "pt") as fh:
            tensors, metadata = {k: fh.get_tensor(k) for k in fh.keys()}, fh.metadata()
        kept = {k: v for k, v in tensors.items() if not k.startswith(module + ".")}
        if kept != tensors:
            save_file(kept, shard, metadata=metadata)
    index = dst / "model.safetensors.index.json"
    if index.exists():
        data = json.loads(index.read_text())
        data["weight_map"] = {k: v for k, v in data["weight_map"].items() if not k.startswith(module + ".")}
        index.write_text(json.dumps(data))
    return dst


def findings(capsys, folder: Path, target: str) -> tuple[int, list[dict]]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--strict", "--json")
    assert code in (0, 1), err
    return code, json.loads(out)["findings"]


@pytest.fixture(scope="module")
def assistant(tmp_path_factory) -> Path:
    return write_assistant(tmp_path_factory.mktemp("missing") / "assistant", TINY, broken=False)


@pytest.mark.parametrize("target", ["vllm==0.25.0", "vllm==0.32.0", "bf16"])
def test_an_assistant_without_a_layer_is_an_error(capsys, assistant, tmp_path, target):
    """It said "healthy for this target": the loader simulation only walked the stored tensors."""
    assert not [f for f in findings(capsys, assistant, target)[1] if f["code"] == "missing-module"]
    code, found = findings(capsys, without(assistant, tmp_path / "lost", DOWN), target)
    missing = [f for f in found if f["code"] == "missing-module"]
    assert code == 1 and [f["subject"] for f in missing] == [DOWN] and missing[0]["severity"] == "error", found


def test_a_llama_without_a_layer_is_an_error(capsys, tmp_path):
    """No loader profile: the other decoder layer stores mlp.down_proj beside gate_proj and up_proj."""
    src = write_mixed(tmp_path / "src")
    code, found = findings(capsys, without(src, tmp_path / "lost", "model.layers.1.mlp.down_proj"), "vllm==0.32.0")
    assert code == 1 and ("missing-module", "model.layers.1.mlp.down_proj") in {(f["code"], f["subject"]) for f in found}, found


def drop_recipe(tmp_path: Path, target: str, module: str) -> Path:
    path = tmp_path / "drop.toml"
    path.write_text(f'name = "drop"\ntarget = "{target}"\n[[rules]]\naction = "drop"\nmodules = ["{module}"]\n')
    return path


def test_a_drop_rule_that_removes_an_expected_module_is_refused_under_a_target(capsys, assistant, tmp_path):
    """It wrote exactly the output doctor now rejects, with exit 0."""
    for extra in ((), ("--dry-run",)):
        code, out, err = run_captured(capsys, "fix", assistant, "-o", tmp_path / "out", "--recipe",
                                      drop_recipe(tmp_path, "vllm==0.25.0", DOWN), *extra)
        assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
        assert DOWN in err and "drop" in err and "nothing was written" in err
        assert not (tmp_path / "out").exists()


def test_without_a_target_the_drop_is_done_and_doctor_names_the_gap(capsys, assistant, tmp_path):
    recipe = tmp_path / "plain.toml"
    recipe.write_text(f'name = "drop"\n[[rules]]\naction = "drop"\nmodules = ["{DOWN}"]\n')
    code, _, err = run_captured(capsys, "fix", assistant, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, err
    assert ("missing-module", DOWN) in {(f["code"], f["subject"]) for f in findings(capsys, tmp_path / "out", "vllm==0.25.0")[1]}


@pytest.fixture(scope="module")
def real(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("missing-real")
    return {key: write_real_model(root / key, key) for key in REAL_MODELS}


@pytest.mark.parametrize("key", [*REAL_MODELS, "mixed_export", "qwen36_export", "broken_export", "correct_export", "ct_export"])
def test_no_fixture_is_said_to_miss_a_module(request, real, capsys, key):
    folder = real[key] if key in REAL_MODELS else request.getfixturevalue(key)
    _, found = findings(capsys, folder, "vllm==0.32.0")
    assert not [f for f in found if f["code"] == "missing-module"], found


def test_a_whole_decoder_layer_dropped_under_a_target_is_refused_and_doctor_names_it(capsys, real, tmp_path):
    """DeepSeek-V3's layout (no loader profile): layer 30's modules dropped while layers 0-61 around it are stored
    (the drop keeps the router's e_score_correction_bias, so the router's siblings are the evidence)."""
    src = real["deepseek-v3-0324"]
    recipe = tmp_path / "drop.toml"
    recipe.write_text('name = "drop"\ntarget = "vllm==0.32.0"\n[[rules]]\naction = "drop"\nmodules = ["model.layers.30.*"]\n')
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--dry-run")
    assert code == 2 and out == "" and err.count("\n") == 1 and "model.layers.30" in err, (code, out, err)
    recipe.write_text('name = "drop"\n[[rules]]\naction = "drop"\nmodules = ["model.layers.30.*"]\n')
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, err
    found = findings(capsys, tmp_path / "out", "vllm==0.32.0")[1]
    assert [f for f in found if f["code"] == "missing-module" and f["subject"].startswith("model.layers.30.")], found


def test_a_layer_of_which_nothing_is_stored_is_missing_whole(capsys, tmp_path):
    src = write_mixed(tmp_path / "src")
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    for file in ("config.json", "hf_quant_config.json"):
        shutil.copy(src / file, renamed / file)
    with safe_open(src / "model.safetensors", "pt") as fh:  # layers 0 and 2: nothing of layer 1
        tensors = {k.replace("model.layers.1.", "model.layers.2."): fh.get_tensor(k) for k in fh.keys()}
    save_file(tensors, renamed / "model.safetensors")
    assert ("missing-module", "model.layers.1") in {(f["code"], f["subject"]) for f in findings(capsys, renamed, "bf16")[1]}
