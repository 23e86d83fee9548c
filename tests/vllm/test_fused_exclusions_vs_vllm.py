"""The shipped `fused_exclusions` of the release in VLLM_VENV is what that release's own exclusion functions answer
(tools/vllm_fused_exclusions.py run there): a quick check beside test_profiles_vs_vllm.py's whole regeneration, and
one that runs against any release's venv (VLLM_VENV=/work/venvs/vllm-0.28 checks vllm-0.28.json)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


def in_release(*args: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), *args], env=clean, cwd="/", timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_shipped_fused_exclusions_are_the_releases_own():
    release = in_release("-c", "import vllm; print(vllm.__version__.split('+')[0])").strip().splitlines()[-1]
    shipped = REPO / "repair" / "targets" / "data" / f"vllm-{'.'.join(release.split('.')[:2])}.json"
    if not shipped.exists() or json.loads(shipped.read_text())["release"] != release:
        pytest.skip(f"no shipped profile for vLLM {release}")
    out = in_release(str(REPO / "tools" / "vllm_fused_exclusions.py"))
    found = json.loads(out[out.index("\n{") + 1:] if not out.startswith("{") else out)
    assert found == json.loads(shipped.read_text())["fused_exclusions"], found
