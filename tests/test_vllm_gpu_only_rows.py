"""vLLM 0.32's architectures this CPU host could not build because their layers make CUDA events when built: why each
still has no row, now that the build goes through.

Inkling's MoE layer (models/inkling/nvidia/moe.py:479) and DeepSeek-V4's attention (models/deepseek_v4/attention.py:330)
make torch.cuda.Event()s, which a CPU-only torch refuses ("Tried to instantiate dummy base class Event"); with
tools/vllm_gpu_stand_ins.py's cuda_sync_stand_in (events and streams whose every use raises and is recorded: they are
used only in forward) vLLM builds them, and the profile meets what really stops each row:
- DeepSeek-V4's package takes its CPU implementation on a CPU platform (models/deepseek_v4/__init__.py:33), another
  class than a GPU's (its weight mapper and fused layers differ: tests/vllm/test_cuda_sync_stand_in.py): its row would
  be the CPU's;
- Inkling's class is the GPU's, but vLLM's own loader has no place for the names transformers' class writes (its text
  class's `attn_sconv` / `embed_norm`; transformers' config lacks the `decoder_dmodel` vLLM builds the towers from):
  a row learned from them would claim vLLM loads no Inkling checkpoint at all (`load_refused`), which no one has shown.
doctor quotes the reason, as for every unprofiled architecture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair import arch
from tests.conftest import run_captured
from tools.profile_report import category

CPU_CLASS = "vLLM builds its CPU implementation of it on this host (vllm.models.deepseek_v4.cpu.model)"
NO_PLACE = "vLLM's own loader has no place for the names transformers' class writes (ValueError: There is no module"


def vllm_032():
    [profile] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.release == (0, 32, 0)]
    return profile


@pytest.mark.parametrize("name", ["InklingForCausalLM", "InklingForConditionalGeneration"])
def test_inkling_builds_but_gets_no_row_from_names_vllm_does_not_take(name):
    profile = vllm_032()
    assert name not in profile.entries
    why = profile.unprofiled[name]
    assert why.startswith(NO_PLACE), why
    assert category(why) == "vLLM's loader takes none of the names transformers' class writes (no checkpoint layout to learn)"


def test_deepseek_v4_gets_no_row_from_vllms_cpu_class():
    profile = vllm_032()
    assert "DeepseekV4ForCausalLM" not in profile.entries
    why = profile.unprofiled["DeepseekV4ForCausalLM"]
    assert why.startswith(CPU_CLASS), why
    assert category(why) == "vLLM builds another class on a CPU host than on a GPU (the row would be the CPU's)"


def test_no_vllm_row_stops_at_a_cuda_event():
    for profile in arch.PROFILES:
        if profile.runtime == "vllm" and profile.release >= (0, 32, 0):
            assert not [a for a, why in profile.unprofiled.items() if "dummy base class" in why], profile.label


def test_doctor_on_deepseek_v4_names_why_vllm_032_has_no_row(capsys, tmp_path):
    from tools.dsv4_fixture import write

    folder = write(Path(tmp_path) / "dsv4")
    code, out, err = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0", "--json")
    assert code == 0, out + err
    checked = json.loads(out)["checked"]
    assert f"generated profile does not cover it ({CPU_CLASS}" in checked, checked
