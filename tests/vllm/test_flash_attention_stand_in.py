"""tools/vllm_runtime.py's flash_attention_stand_in decides nothing: in vLLM 0.32's own process it tells only Qwen4Exp's
QSA module (models/qwen4_exp/nvidia/qsa.py, whose attention constructor asks) that FlashAttention exists, every other
caller of the check still hears "no", and each FlashAttention entry point it puts in place raises and is recorded."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_runtime
from vllm_declared import setup
setup()
from vllm.v1.attention.backends import fa_utils, flash_attn
told = vllm_runtime.flash_attention_stand_in()
qsa = sys.modules[vllm_runtime.FLASH_ATTENTION_ASKED["Qwen4ExpForCausalLM"]]
raised = []
for name in vllm_runtime.FLASH_ATTENTION_ENTRY_POINTS:
    try:
        getattr(flash_attn, name)(1, 2)
    except Exception as e:
        raised.append(type(e).__name__)
vllm_runtime.emit({"told": told, "qsa": qsa.is_flash_attn_varlen_func_available(),
                   "elsewhere": [fa_utils.is_flash_attn_varlen_func_available(),
                                 flash_attn.is_flash_attn_varlen_func_available()],
                   "raised": raised, "calls": vllm_runtime.STAND_IN_CALLS})
"""


def test_only_the_qsa_module_is_told_and_every_entry_point_raises_and_is_recorded():
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", ORACLE, str(REPO / "tools")], capture_output=True, text=True,
                          timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["told"] == ["vllm.models.qwen4_exp.nvidia.qsa"] and got["qsa"] is True, got
    assert got["elsewhere"] == [False, False], got
    names = ["flash_attn_varlen_func", "get_scheduler_metadata", "reshape_and_cache_flash",
             "compile_flash_attn_varlen_func_from_specs", "flash_attn_supports_sinks"]
    assert got["raised"] == ["StubCalled"] * len(names), got
    assert got["calls"] == [f"vllm.v1.attention.backends.flash_attn.{n}" for n in names], got
