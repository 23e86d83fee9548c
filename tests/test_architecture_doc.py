"""docs/ARCHITECTURE.md stays drawn from the code (issue 17): the files it names exist and its table of where each
kind of change goes points at the registries that hold those rows."""

from __future__ import annotations

from tests.test_structure import REPO, doc_paths


def test_architecture_doc_names_real_files():
    """docs/ARCHITECTURE.md is drawn from the code: every repair/, tests/, tools/ or recipes/ path it names exists,
    and its table of where each kind of change goes names the registries that really hold those rows."""
    doc = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    missing = sorted(p for p in doc_paths(doc) if not any(REPO.glob(p)))
    assert not missing, f"docs/ARCHITECTURE.md names files that do not exist: {missing}"
    registries = {"PROFILES": "repair/targets/profiles.py", "ARCHITECTURES": "repair/arch/__init__.py",
                  "FORMATS": "repair/formats/__init__.py", "class Action": "repair/planning/recipe.py",
                  "match step": "repair/execute/compute.py"}
    for symbol, path in registries.items():
        assert symbol in (REPO / path).read_text(), f"{path} no longer holds {symbol}; redraw the table in docs/ARCHITECTURE.md"
