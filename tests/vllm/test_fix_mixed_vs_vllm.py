"""vLLM 0.32's own per-layer resolution on what `fix --target` writes for fused layers and routed experts.

Moved here from tests/test_fix_mixed_attack.py (which builds the outputs) so that `make test-vllm` runs it:
a fused qkv_proj and a routed-experts layer dequantized whole are built unquantized by vLLM, and the
configs a one-member dequantization would have written are built quantized (qkv_proj) or excluded whole
(one expert named): the premise of the refusals there.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import tests.test_fix_mixed_attack as attack
from tests.conftest import read_json
from tools.real_fixture import write_qwen36

from .probe import VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
EXPERTS = attack.EXPERTS


@pytest.fixture(scope="module")
def qwen36(tmp_path_factory) -> Path:
    return write_qwen36(tmp_path_factory.mktemp("fix-mixed-vllm-q36") / "src")


ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization import modelopt
out = {}
for case in json.loads(sys.stdin.read()):
    cfg = modelopt.ModelOptMixedPrecisionConfig.from_config(case["config"])
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    out[case["prefix"]] = None if cfg.is_layer_excluded(case["prefix"]) else cfg._resolve_quant_algo(case["prefix"])
print(json.dumps(out))
"""


def vllm_builds(cases: list[dict]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", ORACLE], input=json.dumps(cases), capture_output=True, text=True, timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_vllm_builds_what_the_target_fix_wrote(capsys, qwen36, tmp_path):
    """vLLM's own resolution on the two outputs: the fused qkv_proj and the routed-experts layer are built
    unquantized, as their now BF16 tensors need; and on the configs a one-member dequantization would have
    written (the premise of the refusals above), vLLM builds them quantized (qkv_proj) or excludes the whole
    routed layer (one expert named)."""
    fused_dir, experts_dir = tmp_path / "f", tmp_path / "e"
    fused_dir.mkdir(), experts_dir.mkdir()
    attack.test_target_fix_dequantizes_the_whole_fused_layer(capsys, fused_dir)
    attack.test_target_fix_dequantizes_the_whole_routed_layer(capsys, qwen36, experts_dir)
    one_shard = read_json(attack._contradicted_fused(tmp_path / "one") / "config.json")["quantization_config"]
    one_shard["quantized_layers"].pop("model.layers.0.self_attn.q_proj")
    cases = [{"prefix": "model.layers.0.self_attn.qkv_proj", "config": read_json(fused_dir / "out" / "config.json")["quantization_config"]},
             {"prefix": EXPERTS, "config": read_json(experts_dir / "out" / "config.json")["quantization_config"]}]
    got = vllm_builds(cases)
    assert got == {"model.layers.0.self_attn.qkv_proj": None, EXPERTS: None}
    one_shard["ignore"] = []
    got = vllm_builds([{"prefix": "model.layers.0.self_attn.qkv_proj", "config": one_shard},
                       {"prefix": EXPERTS, "config": read_json(attack._contradicted_expert(qwen36, tmp_path / "x") / "config.json")["quantization_config"]}])
    assert got == {"model.layers.0.self_attn.qkv_proj": "FP8", EXPERTS: None}
