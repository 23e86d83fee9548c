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


ASK_CLASS = """
import json, sys
from vllm.model_executor.models.registry import ModelRegistry
from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config
arch, entries, prefix = json.loads(sys.argv[1])
config = ModelOptNvFp4Config.from_config({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                          "ignore": entries})
config.packed_modules_mapping = dict(ModelRegistry._try_load_model_cls(arch).packed_modules_mapping)
try:
    print(json.dumps(bool(config.is_layer_excluded(prefix))))
except ValueError as exc:
    print(json.dumps(str(exc)))
"""
# a shard -> the fused layer its class's load_weights stacks it into (olmo_hybrid.py:306-308 and its linear_attn's
# in_proj_qkvg; deepseek_v41/nvidia/model.py:1246-1249): vLLM asks that layer's prefix with the class's own mapping
LOADS_INTO = {"model.layers.0.self_attn.q_proj": "model.layers.0.self_attn.qkv_proj",
              "model.layers.0.self_attn.v_proj": "model.layers.0.self_attn.qkv_proj",
              "model.layers.0.linear_attn.q_proj": "model.layers.0.linear_attn.in_proj_qkvg",
              "model.layers.0.linear_attn.v_proj": "model.layers.0.linear_attn.in_proj_qkvg",
              "model.layers.0.attn.wkv": "model.layers.0.attn.fused_wqa_wkv",
              "model.layers.0.attn.wq_a": "model.layers.0.attn.fused_wqa_wkv",
              "model.layers.0.attn.compressor.wkv": "model.layers.0.attn.compressor.fused_wkv_wgate"}


def test_a_shard_leaf_two_fused_layers_share_is_judged_as_vllm_judges_its_layer():
    """tests/test_fused_exclusions.py SHARED_SHARDS (OlmoHybrid's q/k/v_proj, DeepSeek-V4's wkv): doctor's answer for
    each shard is vLLM's is_layer_excluded on the layer the class stacks it into, with the class's packed mapping."""
    from repair.formats.base import Declaration
    from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
    from repair.targets.profiles import resolve
    from tests.test_fused_exclusions import SHARED_SHARDS

    target = resolve("vllm==0.32.0")
    for arch, entries, shards in SHARED_SHARDS.values():
        declared = target.bind(Declaration("NVFP4", None, tuple(entries), MODELOPT_NVFP4), target.release.row(arch),
                               {"architectures": [arch]})
        for shard in shards:
            said = json.loads(in_release("-c", ASK_CLASS, json.dumps([arch, entries, LOADS_INTO[shard]])).splitlines()[-1])
            assert declared.excludes(shard) is said, (arch, entries, shard, said)
