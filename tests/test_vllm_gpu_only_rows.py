"""vLLM 0.32's architectures this CPU host could not build because their layers make CUDA events when built: why each
still has no row, now that the build goes through.

Inkling's MoE layer (models/inkling/nvidia/moe.py:479) and DeepSeek-V4's attention (models/deepseek_v4/attention.py:330)
make torch.cuda.Event()s, which a CPU-only torch refuses ("Tried to instantiate dummy base class Event"); with
tools/vllm_gpu_stand_ins.py's cuda_sync_stand_in (events and streams whose every use raises and is recorded: they are
used only in forward) vLLM builds them, and the profile meets what each row needs:
- DeepSeek-V4's package takes its CPU implementation on a CPU platform (models/deepseek_v4/__init__.py:33), another
  class than a GPU's (its weight mapper and fused layers differ: tests/vllm/test_cuda_sync_stand_in.py): the profile
  builds the class the package's CUDA branch imports (tools/vllm_gpu_stand_ins.py cuda_classes), and learns its
  names from the published layout its mapper is written for (tools/vllm_saved_names.py published_checkpoint);
- Inkling's class is the GPU's, but vLLM's own loader has no place for the names transformers' class writes (its text
  class's `attn_sconv` / `embed_norm`; transformers' config lacks the `decoder_dmodel` vLLM builds the towers from):
  a row learned from them would claim vLLM loads no Inkling checkpoint at all (`load_refused`), which no one has shown.
doctor quotes Inkling's reason, as for every unprofiled architecture.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from repair import arch
from tests.conftest import run_captured
from tools.profile_report import category

REAL = Path(__file__).resolve().parent / "data" / "real"
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


def test_deepseek_v4_row_is_the_gpu_class_in_the_published_names():
    """The row is NVIDIA's class (its packed fused_wkv_wgate; the CPU class has none), learned from the published names
    read back through vLLM's mapper: the names nvidia/DeepSeek-V4-Flash-NVFP4's hf_quant_config.json uses
    (`layers.N.ffn.experts`, `head`) are checkpoint names of the row, mapped where vLLM 0.32 puts them."""
    profile = vllm_032()
    assert "DeepseekV4ForCausalLM" not in profile.unprofiled
    row = profile.entries["DeepseekV4ForCausalLM"]
    assert row["fused"] == {"fused_wkv_wgate": ["wkv", "wgate"], "fused_wqa_wkv": ["wq_a", "wkv"],
                            "gate_up_proj": ["w1", "w3"]}
    renames = row["renames"]
    assert renames["head"] == "lm_head" and renames["embed"] == "model.embed_tokens"
    assert renames["layers.*.ffn.shared_experts.w2"] == "model.layers.*.ffn.shared_experts.down_proj"
    real = json.loads((REAL / "deepseek-v4-flash-nvfp4" / "hf_quant_config.json").read_text())["quantization"]
    experts = {re.sub(r"\.\d+\.", ".*.", f"{layer}.0.") for layer in real["quantized_layers"]}
    assert experts == {"layers.*.ffn.experts.*."}
    assert all(renames[f"layers.*.ffn.experts.*.{w}"] == f"model.layers.*.ffn.experts.*.{w}" for w in ("w1", "w2", "w3"))
    assert "load_refused" not in row  # vLLM's own loader takes a BF16 checkpoint of these names (measured by the generator)


def test_no_vllm_row_stops_at_a_cuda_event():
    for profile in arch.PROFILES:
        if profile.runtime == "vllm" and profile.release >= (0, 32, 0):
            assert not [a for a, why in profile.unprofiled.items() if "dummy base class" in why], profile.label


def test_doctor_on_deepseek_v4_uses_vllm_032s_generated_row(capsys, tmp_path):
    from tools.dsv4_fixture import write

    folder = write(Path(tmp_path) / "dsv4")
    code, out, err = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0", "--json")
    assert code == 0, out + err
    checked = json.loads(out)["checked"]
    assert "generated profile" in checked and CPU_CLASS not in checked, checked
