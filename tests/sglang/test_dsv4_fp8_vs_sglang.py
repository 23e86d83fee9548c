"""DeepSeek-V4's published `fp8` form: doctor's per-layer schemes for sglang==0.5.23 are what SGLang's own build gives.

SGLang 0.5.23's DeepseekV4ForCausalLM is built here with its own quant config, made by its loader from the published
config.json at tiny, block-aligned size (tools/sglang_dsv4_layers.py --built: HybridFp8NvFp4Config), so each layer's
method is the one its constructor chose (a compressor built without the quant config is never asked). doctor's
schemes come from the checkpoint of the same config (tools/dsv4_fp8_fixture.py). The two name the same layers
differently; SGLang's load_weights maps the checkpoint's names (deepseek_v4.py:5113-5179: `.attn.` -> `.self_attn.`,
`.ffn.` -> `.mlp.`, w1/w3 -> gate_up_proj, w2 -> down_proj; wq_a + wkv -> wqkv_a, compressor wkv + wgate ->
wkv_gate), which LEAVES below writes out per checkpoint leaf.
"""

from __future__ import annotations

import json
import re
import subprocess

import pytest
import torch
from safetensors.torch import save_file

from tools import dsv4_fp8_fixture

from .probe import REPO, SGLANG_PY, TARGET, clean_env, repair_json, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
METHODS = {"Fp8LinearMethod": "fp8_block", "ModelOptNvFp4FusedMoEMethod": "nvfp4", "UnquantizedLinearMethod": "bf16",
           "UnquantizedEmbeddingMethod": "bf16", "NoneType": "bf16"}
# checkpoint module (layer number as N) -> SGLang's layer it loads into
LEAVES = {"attn.wq_a": "self_attn.wqkv_a", "attn.wkv": "self_attn.wqkv_a", "attn.wq_b": "self_attn.wq_b",
          "attn.wo_a": "self_attn.wo_a", "attn.wo_b": "self_attn.wo_b", "attn.compressor.wkv": "self_attn.compressor.wkv_gate",
          "attn.compressor.wgate": "self_attn.compressor.wkv_gate", "attn.indexer.wq_b": "self_attn.indexer.wq_b",
          "attn.indexer.weights_proj": "self_attn.indexer.weights_proj",
          "attn.indexer.compressor.wkv": "self_attn.indexer.compressor.wkv_gate",
          "attn.indexer.compressor.wgate": "self_attn.indexer.compressor.wkv_gate", "ffn.gate": "mlp.gate",
          "ffn.shared_experts.w1": "mlp.shared_experts.gate_up_proj", "ffn.shared_experts.w3": "mlp.shared_experts.gate_up_proj",
          "ffn.shared_experts.w2": "mlp.shared_experts.down_proj"}
NAME = re.compile(r"layers\.(\d+)\.(.+)")


def sglang_layer(module: str) -> str:
    if module in ("embed", "head"):
        return {"embed": "model.embed_tokens", "head": "lm_head"}[module]
    layer, rest = NAME.fullmatch(module).groups()
    rest = "mlp.experts" if rest.startswith("ffn.experts.") else LEAVES[rest]
    return f"model.layers.{layer}.{rest}"


def test_each_layer_is_built_as_doctor_says(tmp_path):
    config = {k: v for k, v in dsv4_fp8_fixture.config().items() if v is not None}  # SGLang refuses published nulls
    quant = tmp_path / "quant"
    quant.mkdir()
    (quant / "config.json").write_text(json.dumps(config))
    save_file({"embed.weight": torch.zeros(2, 2)}, str(quant / "model.safetensors"))
    proc = subprocess.run([str(SGLANG_PY), str(REPO / "tools" / "sglang_dsv4_layers.py"), "--built", str(quant)],
                          capture_output=True, text=True, timeout=900, env=clean_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = json.loads(proc.stdout.splitlines()[-1])
    assert built["quant_config"] == "HybridFp8NvFp4Config"
    theirs = {prefix: METHODS[layer["method"]] for prefix, layer in built["layers"].items() if layer["class"] != "RMSNorm"
              and layer["class"] != "RadixAttention"}
    code, report = repair_json("doctor", dsv4_fp8_fixture.write(tmp_path / "ckpt"), "--target", TARGET)
    assert code == 0, report["findings"]
    ours: dict[str, set[str]] = {}
    for module, scheme in report["schemes"].items():
        ours.setdefault(sglang_layer(module), set()).add(scheme)
    assert {k: {v} for k, v in theirs.items()} == ours
