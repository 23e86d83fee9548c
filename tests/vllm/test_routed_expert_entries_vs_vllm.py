"""Per-expert exclusion entries against vLLM 0.32 itself (#28, vmoe; tests/test_routed_expert_entries.py builds the
layout): vLLM's own ModelOptNvFp4Config.is_layer_excluded, asked as its FusedMoE asks (the layer's name
`...mlp.experts`), decides every expert name the same way modelopt_rule does; vLLM's real loader refuses the DeepSeek-V3
layout with expert 1 stored BF16 and named by per-expert entries (the whole MoE built BF16, the packed experts' scales
have no parameter), which doctor --target vllm==0.32.0 calls an error on that layer; and it loads fix's output with
that MoE unquantized and every other MoE NVFP4."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from repair.formats.base import routed_layer
from repair.formats.modelopt_nvfp4 import modelopt_rule
from tests.conftest import run_captured
from tests.test_routed_expert_entries import EXPERT_ENTRIES, MOE, TARGET, write_one_bf16_expert

from .probe import VLLM_PY, requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = r"""
import json, sys
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
from vllm.model_executor.models.utils import WeightsMapper
out = []
for case in json.loads(sys.stdin.read()):
    cfg = ModelOptNvFp4Config.from_config({"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None, "exclude_modules": case["entries"]}})
    cfg.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
    cfg.apply_vllm_mapper(WeightsMapper())  # what the model's load does: a trailing `X*` also as `X` and `X.*`
    out.append(cfg.is_layer_excluded(case["layer"]))
print(json.dumps(out))
"""
ENTRY_LISTS = [EXPERT_ENTRIES, [f"{MOE}.1*"], ["*experts.1*"], [f"{MOE}.1"], [MOE], ["mlp.experts"], ["experts"],
               ["model.layers.1.mlp.experts.0.gate_proj"], ["model.layers.10.mlp.shared_experts.down_proj"],
               [f"{MOE}.*"], ["model.layers.1*"]]
NAMES = [MOE, f"{MOE}.0.gate_proj", f"{MOE}.1.down_proj", "model.layers.1.mlp.experts.0.up_proj",
         "model.layers.11.mlp.experts.1.gate_proj", "model.layers.10.mlp.shared_experts.down_proj"]


def test_expert_names_are_decided_as_vllms_fused_moe_asks():
    cases = [{"entries": entries, "name": name, "layer": routed_layer(name)} for entries in ENTRY_LISTS for name in NAMES]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", ORACLE], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    vllm = json.loads(proc.stdout.splitlines()[-1])
    ours = [modelopt_rule(c["entries"]).excludes(c["name"]) for c in cases]
    wrong = [(c["entries"], c["name"], v) for c, v, o in zip(cases, vllm, ours) if v != o]
    assert not wrong, wrong


def test_vllm_refuses_the_layout_as_doctor_says_and_loads_fixs_output(capsys, tmp_path):
    src = write_one_bf16_expert(tmp_path / "src", EXPERT_ENTRIES)
    code, out, err = run_captured(capsys, "doctor", src, "--target", TARGET, "--json")
    errors = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert code == 1 and errors and all(MOE in json.dumps(f) for f in errors), errors
    for i, targets in enumerate((TARGET, f"{TARGET},sglang==0.5.23")):  # the second names the layer whole
        assert run_captured(capsys, "fix", src, "-o", tmp_path / f"out{i}", "--target", targets)[0] == 0
    refused, *outputs = in_vllm("vllm_load.py", src, tmp_path / "out0", tmp_path / "out1", "--moe-emulation")
    assert not refused["ok"] and "layers.10.mlp.experts" in refused["error"], refused
    for loaded in outputs:
        assert loaded["ok"], (loaded["dir"], loaded.get("error_type"), loaded.get("error"))
        methods = {k: v["method"] for k, v in loaded["methods"].items() if k.endswith(".mlp.experts.routed_experts")}
        assert methods.pop(f"{MOE}.routed_experts") == "UnquantizedFusedMoEMethod", methods
        assert methods and set(methods.values()) == {"ModelOptNvFp4FusedMoE"}, methods


MAPPED = r"""
import json, sys
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
from vllm.model_executor.models.gpt_oss import GptOssForCausalLM
from vllm.model_executor.models.llama4 import Llama4ForCausalLM
out = {}
for cls, block in ((GptOssForCausalLM, "mlp"), (Llama4ForCausalLM, "feed_forward")):
    entries = ["lm_head"] + [f"model.layers.0.{block}.experts.{p}" for p in ("gate_up_proj", "down_proj")]
    cfg = ModelOptNvFp4Config.from_config({"quantization": {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None, "exclude_modules": entries}})
    cfg.packed_modules_mapping = getattr(cls, "packed_modules_mapping", {})
    cfg.apply_vllm_mapper(cls.hf_to_vllm_mapper)
    out[cls.__name__] = [cfg.is_layer_excluded(f"model.layers.{n}.{block}.experts") for n in range(2)]
print(json.dumps(out))
"""


def test_leafless_3d_expert_entries_exclude_their_fused_moe_after_the_models_mapper():
    """tests/test_fix_runtime_prefixes.py: ModelOpt-style entries naming 3-D experts' stored tensors (`...experts.
    gate_up_proj`) exclude the FusedMoE `...experts` (the entry contains its name), as modelopt_rule says."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", MAPPED], capture_output=True, text=True, timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    vllm = json.loads(proc.stdout.splitlines()[-1])
    for arch, block in (("GptOssForCausalLM", "mlp"), ("Llama4ForCausalLM", "feed_forward")):
        rule = modelopt_rule(["lm_head"] + [f"model.layers.0.{block}.experts.{p}" for p in ("gate_up_proj", "down_proj")])
        assert vllm[arch] == [rule.excludes(f"model.layers.{n}.{block}.experts") for n in range(2)] == [True, False], arch
