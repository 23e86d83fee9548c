"""`inspect --json`'s declared state of every module equals what vLLM 0.32 decides for it (issue 18).

Fixtures: tiny checkpoints of published NVFP4 models with their real quantization configs and tensor-name
patterns (tools/real_fixture.py, tests/data/real). Oracle: tools/vllm_declared.py, one process in the vLLM venv
for all fixtures: vLLM builds each architecture's real model class on the meta device with the quant config it
reads from the folder, and its own load_weights places every checkpoint module; a module is quantized when
its layer's quant_method is not an Unquantized* method (exclusions, fused-shard rules, config-group targets,
layers built with quant_config=None, embeddings: all vLLM's own code).

Compared field: `modules[].declared` of `inspect --json` for every module that stores a `weight` (ModelOpt) or
`weight_packed` (compressed-tensors) tensor: vLLM quantized <=> declared == "quantized" (vLLM unquantized
<=> "excluded" or "-").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tools.real_fixture import REAL_MODELS, real_weight_map, write_llama, write_real_model

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = REPO / "tools" / "vllm_declared.py"
LLAMA_31 = "llama-3.1-8b"
# vLLM 0.32 refuses this config outright (see test_vllm_refuses_deepseek_r1_fused_qkv_a_shards): no per-module
# decision to compare with
REFUSED = {"deepseek-r1"}
COMPARED = [LLAMA_31, *(k for k in REAL_MODELS if k not in REFUSED)]

# Fixtures on which today's `inspect` disagrees with vLLM (issue 18). strict: the fix turns these into XPASS
# failures, and the entry must then be removed.
KNOWN_WRONG: dict[str, str] = {}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("declared_vs_vllm")
    out = {LLAMA_31: write_llama(root / LLAMA_31, "llama-3.1-8b-instruct-fp4",
                                 {n: "model.safetensors" for n in real_weight_map("llama-3.1-8b-instruct-fp4")})}
    out.update({key: write_real_model(root / key, key) for key in REAL_MODELS})
    return out


@pytest.fixture(scope="module")
def vllm_decisions(folders) -> dict[str, dict]:
    """One oracle process for every fixture."""
    names = list(folders)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(ORACLE), *(str(folders[n]) for n in names)], capture_output=True,
                          text=True, timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]
    assert [line["dir"] for line in lines] == [str(folders[n]) for n in names], proc.stderr[-4000:]
    return dict(zip(names, lines))


def inspect_json(folder: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "repair", "inspect", "--json", str(folder)], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def weight_modules(inspected: dict) -> dict[str, str]:
    """Module -> declared, for modules storing a weight tensor."""
    return {m["name"]: m["declared"] for m in inspected["modules"]
            if {f"{m['name']}.weight", f"{m['name']}.weight_packed"} & set(m["tensors"])}


def disagreements(inspected: dict, decided: dict) -> list[str]:
    out = []
    for name, declared in sorted(weight_modules(inspected).items()):
        vllm = decided["modules"].get(name)
        if vllm is None:
            out.append(f"{name}: inspect {declared!r}; vLLM does not load this module")
        elif (declared == "quantized") != vllm["quantized"]:
            out.append(f"{name}: inspect {declared!r}; vLLM builds {vllm['vllm_module']} ({vllm['layer']}, "
                       f"prefix {vllm['prefix']!r}) with {vllm['method']}")
    return out


@pytest.mark.parametrize("key", [pytest.param(k, marks=pytest.mark.xfail(strict=True, reason=KNOWN_WRONG[k]))
                                 if k in KNOWN_WRONG else k for k in COMPARED])
def test_declared_state_is_what_vllm_builds(folders, vllm_decisions, key):
    decided = vllm_decisions[key]
    assert decided["ok"], decided
    assert decided["unplaced"] == []
    inspected = inspect_json(folders[key])
    assert set(weight_modules(inspected)) == set(decided["modules"]), "inspect and vLLM see different modules"
    wrong = disagreements(inspected, decided)
    assert not wrong, f"{len(wrong)} of {len(decided['modules'])} modules:\n" + "\n".join(wrong)


def test_vllm_refuses_deepseek_r1_fused_qkv_a_shards(vllm_decisions):
    """DeepSeek-R1-FP4 (ModelOpt 0.23.0) excludes kv_a_proj_with_mqa but not q_a_proj; vLLM 0.32 fuses both into
    fused_qkv_a_proj (q_lora_rank set) and its is_layer_skipped refuses shards of differing precision."""
    decided = vllm_decisions["deepseek-r1"]
    assert not decided["ok"]
    assert decided["error_type"] == "ValueError"
    assert decided["error"].startswith("Detected some but not all shards of model.layers.0.self_attn.fused_qkv_a_proj")


def test_doctor_predicts_vllms_refusal_of_deepseek_r1(folders, vllm_decisions):
    """doctor names the fused layer vLLM stops on, with vLLM's own error text."""
    decided = vllm_decisions["deepseek-r1"]
    proc = subprocess.run([sys.executable, "-m", "repair", "doctor", "--target", "vllm==0.32.0", "--json", str(folders["deepseek-r1"])],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode == 1, proc.stderr
    predicted = {f["runtime_error"] for f in json.loads(proc.stdout)["findings"] if f["code"] == "fused-shards"}
    assert decided["error"] in predicted
