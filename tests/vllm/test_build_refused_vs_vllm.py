"""Which architectures the release's own model code refuses to build (the profile's `build_refused`), asked of the
release in VLLM_VENV itself: its profile generator is run on Qwen4Exp (which vLLM 0.30 refuses, qwen4_exp/nvidia/
model.py:237, and 0.32 builds) and KimiLinear (which this host cannot build: `No module named 'cutlass'` on 0.32, a
CUDA-only torch call on 0.30) plus every architecture the shipped profile of that release records as refused, and what
it records must be what is shipped: a refusal where the release raised, none where the host failed. Run it with
VLLM_VENV=/work/venvs/vllm-0.30 for 0.30's refusal; doctor's use of it is tests/test_build_refused.py."""

from __future__ import annotations

import json

import pytest

from repair import arch

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
ASKED = ("Qwen4ExpForCausalLM", "KimiLinearForCausalLM")


def test_what_the_release_refuses_to_build_is_what_its_profile_records(tmp_path):
    shipped = {p.label: p for p in arch.PROFILES if p.runtime == "vllm"}
    asked = sorted(set(ASKED) | {a for p in shipped.values() for a in p.build_refused})
    in_vllm("vllm_profile.py", tmp_path / "asked.json", "--only", *asked)
    regenerated = json.loads((tmp_path / "asked.json").read_text())
    profile = shipped[f"vllm {regenerated['release']}"]
    assert regenerated.get("build_refused", {}) == {a: f for a, f in profile.build_refused.items() if a in asked}
    for name in asked:  # built, or unprofiled for the reason shipped (a refusal or this host's)
        assert (name in regenerated["architectures"]) == (name in profile.entries), name
        assert regenerated["unprofiled"].get(name) == profile.unprofiled.get(name), name
    assert "KimiLinearForCausalLM" not in regenerated.get("build_refused", {})
