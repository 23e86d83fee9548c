"""#25's mutation property (tests/test_mutation.py) on ModelOpt's 3-D experts, which `fix` and `fix --tp` now write
expert by expert at their offsets and hash from the page cache: SRC changed at every read while they are made."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.test_mutation import assert_one_of_two_ends, mutate, outputs, run
from tools.bench.experts3d import write_experts

FLAGS = {"fix": ["--target", "bf16", "--jobs", "2", "--quiet"],
         "fix --tp 2": ["--target", "bf16", "--tp", "2", "--jobs", "2", "--quiet"]}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    src = write_experts(tmp_path_factory.mktemp("experts") / "src", 6, 64, 96, layers=2)
    config = json.loads((src / "config.json").read_text())  # experts split by expert across ranks
    (src / "config.json").write_text(json.dumps({**config, "base_model_tp_plan": {"layers.*.mlp.experts": "colwise"}}))
    return src


@pytest.mark.parametrize("kind", ["rewrite", "truncate", "swap", "replace"])
@pytest.mark.parametrize("command", list(FLAGS))
def test_experts_src_changed_at_every_read(command, kind, pristine, tmp_path, monkeypatch, capsys):
    clean = tmp_path / "clean-src"
    shutil.copytree(pristine, clean)
    code, err, counted = run(monkeypatch, capsys, ["fix", clean, "-o", tmp_path / "clean", *FLAGS[command]])
    assert code == 0, err
    reference, reads = outputs(tmp_path / "clean"), counted.count
    outcomes = []
    for k in range(1, reads + 1):
        case = f"{command}: {kind} at read {k} of {reads}"
        src, out = tmp_path / f"src-{k}", tmp_path / f"out-{k}"
        shutil.copytree(pristine, src)
        code, err, trigger = run(monkeypatch, capsys, ["fix", src, "-o", out, *FLAGS[command]], k,
                                 lambda: mutate(kind, src / "model.safetensors"))
        outcomes.append(code)
        rerun = ["fix", src, "-o", tmp_path / f"again-{k}", *FLAGS[command]]
        assert_one_of_two_ends(capsys, (code, err, trigger), out, reference, rerun, case)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(src)
    assert 2 in outcomes
