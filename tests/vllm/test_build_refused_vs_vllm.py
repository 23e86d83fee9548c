"""Which architectures the release's own model code refuses to build (the profile's `build_refused`), asked of the
release in VLLM_VENV itself: its profile generator is run on Qwen4Exp (which vLLM 0.30 refuses, qwen4_exp/nvidia/
model.py:237, and 0.32 builds) and KimiLinear (which this host cannot build on 0.32: `No module named 'cutlass'`; 0.28 and
0.30 build it from its published mla_use_nope), where the release registers them, plus every architecture the shipped
profile of that release records as refused, and what it records must be what is shipped: a refusal where the release
raised, none where the host failed. Run it with VLLM_VENV=/work/venvs/vllm-0.30 for 0.30's refusal, -0.28 for 0.28's
(DeepSeek-V4's fp8 KV cache); doctor's use of it is tests/test_build_refused.py."""

from __future__ import annotations

import json

import pytest

from repair import arch

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
ASKED = ("Qwen4ExpForCausalLM", "KimiLinearForCausalLM")


def test_what_the_release_refuses_to_build_is_what_its_profile_records(tmp_path, release):
    shipped = {p.label: p for p in arch.PROFILES if p.runtime == "vllm"}
    profile = shipped[f"vllm {release}"]
    registered = set(profile.entries) | set(profile.unprofiled)  # 0.28 registers no Qwen4Exp
    asked = sorted(set(ASKED) & registered | {a for p in shipped.values() for a in p.build_refused} & registered)
    in_vllm("vllm_profile.py", tmp_path / "asked.json", "--only", *asked)
    regenerated = json.loads((tmp_path / "asked.json").read_text())
    assert regenerated["release"] == release
    assert regenerated.get("build_refused", {}) == {a: f for a, f in profile.build_refused.items() if a in asked}
    for name in asked:  # built, or unprofiled for the reason shipped (a refusal or this host's)
        assert (name in regenerated["architectures"]) == (name in profile.entries), name
        assert regenerated["unprofiled"].get(name) == profile.unprofiled.get(name), name
    assert "KimiLinearForCausalLM" not in regenerated.get("build_refused", {})
