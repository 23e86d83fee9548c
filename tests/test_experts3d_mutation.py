"""#25's mutation property (tests/test_mutation.py) on ModelOpt's 3-D experts, which `fix` and `fix --tp` now write
expert by expert at their offsets and hash from the page cache: SRC changed at every read while they are made."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_mutation import assert_changed_at_every_read
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
    args = lambda src, out: ["fix", src, "-o", out, *FLAGS[command]]
    assert_changed_at_every_read(monkeypatch, capsys, tmp_path, pristine, args, kind, command)
