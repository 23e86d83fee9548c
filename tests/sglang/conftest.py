"""Session fixtures of the SGLang tier: every real-config fixture built once, and SGLang's verdict on each (one probe
process loads them all: SGLang's import costs ~15 s, each tiny model under a second)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .fixtures import build_all
from .probe import load_in_sglang


@pytest.fixture(scope="session")
def real_fixtures(tmp_path_factory) -> dict[str, Path]:
    return build_all(tmp_path_factory.mktemp("sglang_real"))


@pytest.fixture(scope="session")
def sglang_verdicts(real_fixtures) -> dict[str, dict]:
    lines = load_in_sglang(list(real_fixtures.values()))
    return {name: lines[folder] for name, folder in real_fixtures.items()}
