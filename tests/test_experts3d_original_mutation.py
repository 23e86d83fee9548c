"""#25's mutation property (tests/test_mutation.py) on `--original`'s 3-D experts, now verified one expert at a time and
then copied from the original: the original changed at every read of the run."""

from __future__ import annotations

import pytest

from tests.test_mutation import assert_changed_at_every_read
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
    assert_changed_at_every_read(monkeypatch, capsys, tmp_path, original, args, kind, f"{flags}: the original")
