"""vLLM 0.32 refuses ModelOpt's nested form of an algo its ModelOpt configs do not list, and doctor quotes its error.

ModelOpt's NVFP4_AWQ, declared as the single quant_algo in hf_quant_config.json only (config.json without
quantization_config): vLLM 0.32's config reading (transformers_utils/model_arch_config_convertor.py:263-290) names a
quant_method for the FP8 algos and NVFP4 and raises `Unknown ModelOpt quant algo: <as written>` on any other, before
its ModelOpt config's own list is asked. doctor's data records that rule ("*", tools/vllm_nested_algos.py); it had
quoted the ModelOpt config's list error instead, which vLLM never reaches here. doctor targets the venv's release:
VLLM_VENV=/work/venvs/vllm-0.28 judges 0.28's data by 0.28's loader (same code there, model_arch_config_convertor.py:260-287).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.mixed_helpers import write_single_nested

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]


@pytest.mark.parametrize("algo", ["NVFP4_AWQ", "nvfp4_awq"])
def test_nested_nvfp4_awq_is_refused_in_vllms_words(tmp_path, algo, release):
    folder = write_single_nested(tmp_path / "awq", algo)
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_load.py"), str(folder)], env=clean, cwd="/",
                          timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    done = subprocess.run([sys.executable, "-m", "repair", "doctor", str(folder), "--target", f"vllm=={release}", "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert done.returncode == 1, done.stderr
    said = [f["runtime_error"] for f in json.loads(done.stdout)["findings"] if f["code"] == "quant-config"]
    assert not loaded["ok"] and len(said) == 1, (loaded, said)
    assert f"Value error, {said[0].removeprefix('ValueError: ')} [" in loaded["error"], (loaded["error"], said)
