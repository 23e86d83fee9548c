"""Session fixtures of the doctor-vs-vLLM tests (test_doctor_vs_vllm.py, test_doctor_defects_vs_vllm.py).

One set of folders and one batch of probe processes serves both files. test_probe_smoke.py and
test_compressed_tensors_vs_vllm.py define their own `folders` and `probe`, which take precedence there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .doctor_cases import RUNS, build_folders
from .probe import ProbeRuns, prefetch_when_many

DOCTOR_MODULES = ("tests.vllm.test_doctor_vs_vllm", "tests.vllm.test_doctor_defects_vs_vllm")


@pytest.fixture(scope="session")
def folders(tmp_path_factory, broken_export) -> dict[str, Path]:
    return build_folders(tmp_path_factory.mktemp("doctor_vs_vllm"), broken_export)


@pytest.fixture(scope="session")
def probe(request, folders):
    runs = ProbeRuns(folders, RUNS, traceback=True)
    prefetch_when_many(request, runs, modules=DOCTOR_MODULES)
    yield runs
    runs.close()
