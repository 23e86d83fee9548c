"""tools/vllm_gpu_stand_ins.py's mla_prefill_stand_in decides nothing, asked in the vLLM venv's own process.

A release whose CPU platform names no MLA prefill backend (vLLM 0.28: VLLM_VENV=/work/venvs/vllm-0.28) picks the
FlashAttention one for every MLA layer (prefill/selector.py:110-115), whose module does not import on CPU: before the
stand-in that is vLLM's ImportError; after it the same class is picked, `compile_flash_attn_varlen_func_from_specs`
is None (as fa_utils.py's XPU/ROCm branches), the backend constructs, its kernel raises and is recorded, and every
other caller still hears that FlashAttention is absent. A release whose platform answers itself (0.32, platforms/
cpu.py:182) is left as it is: no stand-in, and its own CPU backend never imports the FlashAttention one.
"""

from __future__ import annotations

import pytest

from .probe import requires_vllm, run_oracle

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_runtime, vllm_gpu_stand_ins
from vllm.platforms import current_platform
from vllm.v1.attention.backends import fa_utils
from vllm.v1.attention.backends.mla.prefill.selector import get_mla_prefill_backend

def picked():
    try:
        cls = get_mla_prefill_backend(None)
        return f"{cls.__module__}.{cls.__qualname__}"
    except Exception as e:
        return f"{type(e).__name__}: {e}"

own = hasattr(type(current_platform), "get_mla_prefill_backend_cls")
before = picked()
installed = vllm_gpu_stand_ins.mla_prefill_stand_in()
after = picked()
got = {"own": own, "before": before, "installed": installed, "after": after,
       "imported": "vllm.v1.attention.backends.mla.prefill.flash_attn" in sys.modules,
       "specs": repr(getattr(fa_utils, "compile_flash_attn_varlen_func_from_specs", "absent")),
       "available": fa_utils.is_flash_attn_varlen_func_available()}
if installed:
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.mla.prefill.flash_attn import FlashAttnPrefillBackend
    backend = FlashAttnPrefillBackend(num_heads=2, scale=0.1, kv_lora_rank=32, qk_nope_head_dim=16,
                                      qk_rope_head_dim=16, v_head_dim=16, vllm_config=VllmConfig())
    try:
        backend.flash_attn_varlen_func(1, 2)
    except Exception as e:
        got["raised"] = type(e).__name__
got["calls"] = vllm_runtime.STAND_IN_CALLS
vllm_runtime.emit(got)
"""


def test_the_flash_attention_prefill_backend_is_built_where_the_cpu_platform_has_none_and_its_kernel_is_recorded():
    got = run_oracle(ORACLE)
    assert got["available"] is False, got  # every other caller still hears: no FlashAttention here
    if got["own"]:  # 0.32: the platform's own CPU backend; nothing stood in, the FlashAttention module never imported
        assert not got["installed"] and got["before"] == got["after"] and "ImportError" not in got["after"], got
        assert not got["imported"] and got["specs"] == "'absent'" and got["calls"] == [], got
        return
    prefill = "vllm.v1.attention.backends.mla.prefill.flash_attn"
    assert got["before"].startswith("ImportError: cannot import name 'compile_flash_attn_varlen_func_from_specs'"), got
    assert got["installed"] and got["after"] == f"{prefill}.FlashAttnPrefillBackend" and got["specs"] == "None", got
    assert got["raised"] == "StubCalled" and got["calls"] == [f"{prefill}.flash_attn_varlen_func"], got
