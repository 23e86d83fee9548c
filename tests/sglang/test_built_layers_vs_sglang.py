"""doctor --target sglang==0.5.23 asks the config about SGLang's own layer names, not only the checkpoint's (#28).

SGLang's constructor asks its quant config about every layer under its own prefix; where those differ from the
checkpoint's names (DeepSeek-V4: checkpoint/vLLM `layers.N.attn.fused_wqa_wkv`, SGLang `model.layers.N.self_attn.wqkv_a`),
a compressed-tensors config whose targets name vLLM's layers (RedHatAI's) makes SGLang refuse the model ("Unable to
find matching target"). The shipped `built_layers` block is what SGLang's own model code builds (regenerated here from
it, tools/sglang_built_layers.py), and doctor on a checkpoint with the checkpoint's names predicts SGLang's refusal in
SGLang's words: the text SGLang's own quant config raises for the same layer (tools/sglang_dsv4_layers.py).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tools import dsv4_fixture
from tools.sglang_built_layers import generate, write_tiny

from .probe import REPO, SGLANG_PY, SGLANG_VENV, TARGET, clean_env, repair_json, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
SHIPPED = REPO / "repair" / "targets" / "data" / "sglang-0.5.23.json"


def test_shipped_built_layers_are_sglangs_own():
    assert json.loads(SHIPPED.read_text())["rules"]["built_layers"] == generate(SGLANG_VENV)


def test_doctor_predicts_sglangs_refusal_of_vllm_named_targets(tmp_path):
    ckpt = dsv4_fixture.write(tmp_path / "redhatai")  # the published config (its nulls kept) and vLLM's names
    quantization = json.loads((ckpt / "config.json").read_text())["quantization_config"]
    folders = write_tiny(tmp_path / "plain", None), write_tiny(tmp_path / "config", quantization)  # as SGLang reads them
    proc = subprocess.run([str(SGLANG_PY), str(REPO / "tools" / "sglang_dsv4_layers.py"), *map(str, folders)],
                          capture_output=True, text=True, timeout=900, env=clean_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    layers = json.loads(proc.stdout.splitlines()[0])["layers"]
    refusals = [v["method"] for v in layers.values() if "Unable to find matching target" in v["method"]]
    assert refusals  # SGLang's own quant config refuses layers of its own model under this config
    code, report = repair_json("doctor", ckpt, "--target", TARGET)
    assert code == 1
    assert {stop["error"] for stop in report["runtime_stops_at"]} == {refusals[0]}
    assert repair_json("doctor", ckpt, "--target", "vllm==0.32.0")[0] == 0  # vLLM's names are the targets' own
