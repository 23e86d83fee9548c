"""Each target's layer rows carry only its own runtime's name facts (#28).

SGLang and TensorRT-LLM take their layer roles and fused layers from vLLM 0.32's profile (`layer_rows`), but the prefix
vLLM's layer hands its quant config (`prefixes`), what vLLM's load_weights refuses (`nvfp4_load_refused`) or drops
(`dropped`) are vLLM's code, not theirs. Afmoe: vLLM 0.32 builds lm_head with the prefix "" (no exclusion reaches it);
SGLang 0.5.23's afmoe.py builds it with `add_prefix("lm_head", prefix)`, so the exported `lm_head` exclusion holds and
SGLang loads the healthy export (its probe builds lm_head BF16).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from repair import arch
from repair.targets.layer_names import target_family
from repair.targets.profiles import resolve
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

OTHERS = ("sglang==0.5.23", "trtllm==1.4.0", "trtllm==1.2.0")
VLLM = arch.newest("vllm")


def _instance(pattern: str) -> str:
    return re.sub(r"(?<=\.)\*(?=\.|$)", "3", pattern)


@pytest.mark.parametrize("arch_name", ["AfmoeForCausalLM", "ExaoneMoeForCausalLM"])
def test_sglang_and_trtllm_read_the_lm_head_exclusion_vllm_cannot(arch_name, tmp_path, capsys):
    src = export(tmp_path / "src", arch_name, arch_name.lower().replace("forcausallm", ""), {}, ["lm_head"])
    assert run_captured(capsys, "doctor", "--target", "vllm==0.32.0", src)[0] == 1  # vLLM's prefix '': no entry reaches it
    for target in ("sglang==0.5.23", "trtllm==1.4.0"):
        code, out, err = run_captured(capsys, "doctor", "--target", target, "--strict", "--json", src)
        assert code == 0, (target, out, err)
        assert json.loads(out)["runtime_stops_at"] in (None, [], {}), out


@pytest.mark.parametrize("spec", OTHERS)
def test_other_runtimes_rows_hold_none_of_vllms_name_facts(spec):
    target = resolve(spec)
    rules = target.profile.rules
    for name, entry in VLLM.entries.items():
        config = {"architectures": [name]}
        family = target_family(target, config)
        own = rules.layer_names.get(name, {})
        for pattern in entry.get("prefixes", {}):
            if pattern in own:
                continue
            module = _instance(pattern)
            assert family.runtime_name(module) == module, (spec, name, module)
            assert family.exclusion_name(module) == module, (spec, name, module)
        assert family.nvfp4_load_refused == () and family.dropped_tensors == (), (spec, name)
    assert target_family(resolve("vllm==0.32.0"), {"architectures": ["AfmoeForCausalLM"]}).runtime_name("lm_head") == ""

