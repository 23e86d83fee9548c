"""Speed work must not change a byte: every tensor and config file `fix` writes equals what main wrote
(65350c6, recorded by tools/golden_bytes.py run with main's code), on generated and real-producer fixtures,
for the default repair, `--target bf16` (1 to 3 jobs), a vLLM target, `--tp 2` and requantizing from `--original`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.golden_bytes import CASES, fixtures, run_case

GOLDEN = json.loads((Path(__file__).parent / "data" / "golden_bytes.json").read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return fixtures(tmp_path_factory.mktemp("golden-src"))


@pytest.mark.parametrize("case", list(CASES))
def test_fix_writes_the_bytes_main_wrote(built, case, tmp_path):
    assert run_case(case, built, tmp_path / "out") == GOLDEN[case]
