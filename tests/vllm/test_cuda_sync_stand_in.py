"""tools/vllm_gpu_stand_ins.py's cuda_sync_stand_in decides nothing, and cpu_implementation says why DeepSeek-V4 gets
no row: in vLLM 0.32's own process on this CPU-only torch, torch.cuda.Event() refuses to be made (what stopped the
profile at Inkling's and DeepSeek-V4's layers); with the stand-in it is made, and every method of it raises and is
recorded. vLLM 0.32 resolves DeepseekV4ForCausalLM here to its CPU implementation (models/deepseek_v4/__init__.py:33),
whose weight mapper renames what NVIDIA's keeps (an NVFP4 linear's input_scale, a linear's weight_scale) and whose
packed layers lack NVIDIA's fused_wkv_wgate: the CPU class is not the one a GPU builds, so it gives no row."""

from __future__ import annotations

import pytest

from .probe import requires_vllm, run_oracle

pytestmark = [pytest.mark.vllm, requires_vllm]

ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_runtime, vllm_gpu_stand_ins
import torch

def made():
    try:
        torch.cuda.Event(); torch.cuda.Stream()
        return "made"
    except Exception as e:
        return f"{type(e).__name__}: {e}"

before = made()
installed = vllm_gpu_stand_ins.cuda_sync_stand_in()
after = made()
def outcome(call):
    try:
        return repr(call())
    except Exception as e:
        return type(e).__name__

raised = [outcome(lambda: torch.cuda.Event().record()), outcome(lambda: torch.cuda.Stream().wait_event(None))]
from vllm import ModelRegistry
from vllm.models.deepseek_v4.nvidia import model as nvidia
from vllm.models.inkling.nvidia import model as inkling
here = ModelRegistry._try_load_model_cls("DeepseekV4ForCausalLM")
names = ["layers.0.ffn.shared_experts.w1.input_scale", "layers.0.attn.wo_a.weight_scale"]
vllm_runtime.emit({"before": before, "installed": installed, "after": after, "raised": raised,
                   "calls": vllm_runtime.STAND_IN_CALLS, "module": here.__module__,
                   "cpu_mapped": [here.hf_to_vllm_mapper._map_name(n) for n in names],
                   "nvidia_mapped": [nvidia.DeepseekV4ForCausalLM.hf_to_vllm_mapper._map_name(n) for n in names],
                   "cpu_packed": sorted(here.packed_modules_mapping),
                   "nvidia_packed": sorted(nvidia.DeepseekV4ForCausalLM.packed_modules_mapping),
                   "why": [vllm_gpu_stand_ins.cpu_implementation(c) for c in
                           (here, nvidia.DeepseekV4ForCausalLM, inkling.InklingForCausalLM)]})
"""


def test_events_and_streams_are_made_and_every_use_raises_and_is_recorded_and_dsv4_here_is_the_cpu_class():
    got = run_oracle(ORACLE)
    assert got["before"] == "RuntimeError: Tried to instantiate dummy base class Event", got
    assert got["installed"] is True and got["after"] == "made", got
    assert got["raised"] == ["StubCalled", "StubCalled"], got
    assert got["calls"] == ["torch.cuda.Event.record", "torch.cuda.Stream.wait_event"], got
    assert got["module"] == "vllm.models.deepseek_v4.cpu.model", got
    assert got["cpu_mapped"] == ["model.layers.0.ffn.shared_experts.w1.input_scale_2",
                                 "model.layers.0.attn.wo_a.weight_scale_inv"], got
    assert got["nvidia_mapped"] == ["model.layers.0.ffn.shared_experts.w1.input_scale",
                                    "model.layers.0.attn.wo_a.weight_scale"], got
    assert set(got["nvidia_packed"]) - set(got["cpu_packed"]) == {"fused_wkv_wgate"}, got
    cpu_why, nvidia_why, inkling_why = got["why"]
    assert cpu_why.startswith("vLLM builds its CPU implementation of it on this host (vllm.models.deepseek_v4.cpu.model)")
    assert nvidia_why is None and inkling_why is None, got
