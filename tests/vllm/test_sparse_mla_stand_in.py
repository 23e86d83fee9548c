"""tools/vllm_gpu_stand_ins.py's sparse_mla_stand_in decides nothing: in vLLM 0.32's own process the CPU platform's
answer changes only where it refused (a layer asking for sparse MLA: platforms/cpu.py:150), to vLLM's own FlashMLA
sparse backend; dense MLA and plain attention get the platform's own backends, and each FlashMLA entry point the
stand-in puts in place raises and is recorded. Without it, vLLM 0.32 refuses to build DeepSeek-V3.2 and GLM-5 here."""

from __future__ import annotations

import pytest

from .probe import requires_vllm, run_oracle

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_runtime, vllm_gpu_stand_ins
from vllm_declared import setup
from vllm.platforms import current_platform
from vllm.v1.attention.selector import AttentionSelectorConfig
from vllm.v1.attention.backends.mla import flashmla_sparse
import torch

def ask(use_mla, use_sparse):
    config = AttentionSelectorConfig(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=None,
                                     use_mla=use_mla, use_sparse=use_sparse)
    try:
        return current_platform.get_attn_backend_cls(None, attn_selector_config=config)
    except Exception as e:
        return f"{type(e).__name__}: {e}"

from vllm.v1.worker.workspace import is_workspace_manager_initialized as workspace

before = [ask(False, False), ask(True, False), ask(True, True)]
setup()  # every stand-in the vLLM tools install (tools/vllm_runtime.py kernel_stand_ins)
after = [ask(False, False), ask(True, False)]
workspaces = [workspace()]  # vLLM's CPU worker makes none: only a sparse layer's answer does
after.append(ask(True, True))
workspaces.append(workspace())
def outcome(entry_point):
    try:
        return repr(entry_point(1, 2))
    except Exception as e:
        return type(e).__name__

raised = [outcome(getattr(flashmla_sparse, n)) for n in vllm_gpu_stand_ins.FLASHMLA_ENTRY_POINTS]
vllm_runtime.emit({"before": before, "after": after, "workspaces": workspaces, "raised": raised,
                   "calls": vllm_runtime.STAND_IN_CALLS})
"""


def test_only_a_refused_sparse_layer_is_answered_and_every_flashmla_entry_point_raises_and_is_recorded():
    got = run_oracle(ORACLE)
    assert got["before"][2] == "NotImplementedError: Sparse Attention is not supported on CPU.", got
    assert got["after"][:2] == got["before"][:2], got  # dense MLA, plain attention: the platform's own answer
    assert got["after"][2] == "vllm.v1.attention.backends.mla.flashmla_sparse.FlashMLASparseBackend", got
    assert got["workspaces"] == [False, True], got
    names = ["flash_mla_sparse_fwd", "flash_mla_with_kvcache", "get_mla_metadata"]
    assert got["raised"] == ["StubCalled"] * len(names), got
    assert got["calls"] == [f"vllm.v1.attention.backends.mla.flashmla_sparse.{n}" for n in names], got
