"""Every folder of tests/data/real/ is a fixture of the SGLang tier, or says why not (runs in the main suite too)."""

from __future__ import annotations

from .fixtures import FIXTURES, NOT_BUILT, real_folders


def test_every_real_config_is_covered():
    built = {real for real, _ in FIXTURES.values()}
    assert real_folders() - built - set(NOT_BUILT) == set()
    assert not built & set(NOT_BUILT)
