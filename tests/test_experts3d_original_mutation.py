"""#25's mutation property (tests/test_mutation.py) on `--original`'s 3-D experts, now verified one expert at a time and
then copied from the original: the original changed at every read of the run."""

from __future__ import annotations

import shutil

import pytest

from tests.test_mutation import assert_one_of_two_ends, mutate, outputs, run
from tools.bench.experts3d import take_original_recipe, write_quantized_experts


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    base = tmp_path_factory.mktemp("experts")
    src = write_quantized_experts(base / "src", base / "original", 4, 64, 96, layers=2)
    return src, base / "original", take_original_recipe(base / "take.toml", 2)


@pytest.mark.parametrize("kind", ["rewrite", "truncate", "swap", "replace"])
@pytest.mark.parametrize("flags", [["--jobs", "2"], ["--tp", "2", "--jobs", "2"]], ids=["fix", "fix --tp 2"])
def test_original_changed_at_every_read(flags, kind, pristine, tmp_path, monkeypatch, capsys):
    src, original, recipe = pristine
    args = lambda orig, out: ["fix", src, "-o", out, "--recipe", recipe, "--original", orig, "--quiet", *flags]
    code, err, counted = run(monkeypatch, capsys, args(original, tmp_path / "clean"))
    assert code == 0, err
    reference, reads = outputs(tmp_path / "clean"), counted.count
    outcomes = []
    for k in range(1, reads + 1):
        case = f"{flags}: {kind} of the original at read {k} of {reads}"
        orig, out = tmp_path / f"orig-{k}", tmp_path / f"out-{k}"
        shutil.copytree(original, orig)
        code, err, trigger = run(monkeypatch, capsys, args(orig, out), k, lambda: mutate(kind, orig / "model.safetensors"))
        outcomes.append(code)
        assert_one_of_two_ends(capsys, (code, err, trigger), out, reference, args(orig, tmp_path / f"again-{k}"), case)
        shutil.rmtree(out, ignore_errors=True)
        shutil.rmtree(orig)
    assert 2 in outcomes
