"""doctor's fused-shard prediction equals vLLM 0.32's refusal, for both formats (issue 18).

A real-config fixture (tools/real_fixture.py) whose exclusion list names one shard of a fused layer by its
exact name: vLLM's ModelOpt `is_layer_skipped` and compressed-tensors `should_ignore_layer` then stop the
model build. The oracle (tools/vllm_declared.py) builds the model with vLLM's own classes; doctor must name
that layer with vLLM's own error text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.real_fixture import write_real_model

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = REPO / "tools" / "vllm_declared.py"
# fixture -> (config file, exclusion list path in it, the one shard it adds by exact name)
CASES = {
    "ct-llama-dense": ("config.json", ("quantization_config", "ignore"), "model.layers.1.mlp.up_proj"),
    "llama-3.3-70b": ("hf_quant_config.json", ("quantization", "exclude_modules"), "model.layers.0.self_attn.k_proj"),
}


def one_shard_excluded(folder: Path, key: str) -> Path:
    file, (section, field), shard = CASES[key]
    data = json.loads((folder / file).read_text())
    data[section][field] = [*data[section].get(field, []), shard]
    (folder / file).write_text(json.dumps(data, indent=2))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("fused_shards_vs_vllm")
    return {key: one_shard_excluded(write_real_model(root / key, key), key) for key in CASES}


@pytest.fixture(scope="module")
def refusals(folders) -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(ORACLE), *(str(f) for f in folders.values())], capture_output=True,
                          text=True, timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    return dict(zip(folders, lines))


@pytest.mark.parametrize("key", list(CASES))
def test_doctor_predicts_vllms_fused_shard_refusal(folders, refusals, key):
    decided = refusals[key]
    assert not decided["ok"] and decided["error_type"] == "ValueError", decided
    proc = subprocess.run([sys.executable, "-m", "repair", "doctor", "--target", "vllm==0.32.0", "--json", str(folders[key])],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    fused = [f for f in json.loads(proc.stdout)["findings"] if f["code"] == "fused-shards"]
    assert [f["runtime_error"] for f in fused] == [decided["error"]]
