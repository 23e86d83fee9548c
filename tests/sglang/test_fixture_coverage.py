"""Every folder of tests/data/real/ is a fixture of the SGLang tier, is checked layer by layer by a named test, or says
why not (runs in the main suite too)."""

from __future__ import annotations

from pathlib import Path

from .fixtures import FIXTURES, NOT_BUILT, RULES_CHECKED, real_folders


def test_every_real_config_is_covered():
    built = {real for real, _ in FIXTURES.values()}
    assert real_folders() - built - set(NOT_BUILT) - set(RULES_CHECKED) == set()
    assert not built & set(NOT_BUILT) and not built & set(RULES_CHECKED) and not set(NOT_BUILT) & set(RULES_CHECKED)


def test_every_rules_checked_folder_is_named_by_its_test():
    root = Path(__file__).resolve().parents[2]
    for folder, test in RULES_CHECKED.items():
        assert folder in (root / test).read_text(), (folder, test)
