"""MIXED_PRECISION: the per-layer algorithm the tool declares equals vLLM 0.32's own resolution.

Oracle: vLLM's `ModelOptMixedPrecisionConfig.from_config(config.json quantization_config)` with a Llama
`packed_modules_mapping`, asked `_resolve_quant_algo(prefix)` and `is_layer_excluded(prefix)` in the vLLM
venv (one process). Compared: `Declaration.algorithm` for the same runtime prefixes, on the healthy mixed
checkpoint's config (ModelOpt's own converter wrote it) and on a map with routed-experts, DeepSeek-V4-style,
lm_head and fused-shard cases. Also: the refusal vLLM raises for a single NVFP4_AWQ quant_algo is the text
doctor quotes, and NVFP4_AWQ has no linear method in vLLM (so a mixed NVFP4_AWQ layer is built unquantized).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from repair import formats
from repair.doctor.declared import RUNTIME_REFUSED
from repair.formats.algorithms import LayerAlgorithms
from repair.io.checkpoint import open_checkpoint
from tests.mixed_helpers import write_mixed
from tests.test_mixed_format import RESOLUTION_CASES, RESOLUTION_LAYERS

from .probe import VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization import modelopt
cases = json.loads(sys.stdin.read())
out = {}
for case in cases:
    cfg = modelopt.ModelOptMixedPrecisionConfig.from_config(case["config"])
    cfg.packed_modules_mapping = case["packed"]
    got = {}
    for prefix in case["prefixes"]:
        try:
            algo = cfg._resolve_quant_algo(prefix)
        except ValueError as err:
            algo = "ValueError: " + str(err)
        got[prefix] = None if cfg.is_layer_excluded(prefix) else algo
    out[case["name"]] = got
try:
    modelopt.ModelOptNvFp4Config.from_config({"quantization": {"quant_algo": "NVFP4_AWQ", "group_size": 16,
                                              "kv_cache_quant_algo": None, "exclude_modules": []}})
    out["awq_refusal"] = None
except ValueError as err:
    out["awq_refusal"] = "ValueError: " + str(err)
out["awq_linear"] = "NVFP4_AWQ" in modelopt.LINEAR_ALGOS
print(json.dumps(out))
"""


def vllm(cases: list[dict]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", ORACLE], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("mixed-vllm") / "healthy", exclude=None)


def ours(declaration, prefixes: list[str]) -> dict:
    packed = {k: tuple(v) for k, v in PACKED.items()}
    out = {}
    for prefix in prefixes:
        algo, error = (None, None)
        if not declaration.excludes(prefix, declaration.exclusions) and declaration.layer_algos is not None:
            algo, error = declaration.layer_algos.lookup(prefix, packed)
        out[prefix] = error or algo
    assert all(declaration.algorithm(p, packed) == (None if (v or "").startswith("ValueError") else v) for p, v in out.items())
    return out


def test_resolution_matches_vllm(healthy):
    ckpt = open_checkpoint(healthy)
    declaration = formats.detect(ckpt).read_declaration(ckpt)
    quant_cfg = ckpt.config["quantization_config"]
    prefixes = [f"model.layers.{i}.{p}" for i in range(2) for p in
                ("self_attn.qkv_proj", "self_attn.q_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj", "mlp.gate_proj")]
    prefixes += ["lm_head", "model.embed_tokens"]
    synthetic = {"quant_algo": "MIXED_PRECISION", "quant_method": "modelopt", "ignore": ["model.layers.9*"],
                 "quantized_layers": {k: {"quant_algo": v, **({"group_size": 16} if "NVFP4" in v else {})}
                                      for k, v in {**RESOLUTION_LAYERS, "model.layers.9.mlp.down_proj": "FP8"}.items()}}
    extra = [p for p, _ in RESOLUTION_CASES]
    extra += ["model.layers.3.self_attn.qkv_proj", "model.layers.9.mlp.down_proj", "model.layers.0.mlp.experts.0.gate_proj"]
    got = vllm([{"name": "healthy", "config": quant_cfg, "packed": PACKED, "prefixes": prefixes},
                {"name": "synthetic", "config": synthetic, "packed": PACKED, "prefixes": extra}])
    assert ours(declaration, prefixes) == got["healthy"]
    synthetic_decl = declaration.__class__("MIXED_PRECISION", ("model.layers.9*",), None, declaration.format, None,
                                           LayerAlgorithms(tuple((k, v["quant_algo"]) for k, v in synthetic["quantized_layers"].items())))
    assert ours(synthetic_decl, extra) == {p: (v.replace("{'NVFP4', 'FP8'}", "{'FP8', 'NVFP4'}") if v else v) for p, v in got["synthetic"].items()}


def test_nvfp4_awq_is_refused_alone_and_has_no_linear_method():
    got = vllm([])
    assert got["awq_linear"] is False
    assert got["awq_refusal"] == RUNTIME_REFUSED["NVFP4_AWQ"]
