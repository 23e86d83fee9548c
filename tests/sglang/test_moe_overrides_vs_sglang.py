"""SGLang 0.5.23's own model-specific server-arg overrides of the MoE runner backend, run for two families whose
providers need nothing but the server args and the HF config (Qwen3-MoE, GLM-4 MoE; tools/sglang_moe_override_probe.py,
under SGLang's own `override_platform`), against tools/sglang_moe_overrides.py's ast reading of the same files: every
backend the code picks is one the data records for the architecture, every recorded one is picked in some case, and
none is picked off SM100, as each recorded condition says."""

from __future__ import annotations

import pytest

from repair.targets.runtime_rules import shipped_rules
from .probe import requires_sglang, run_tool_probe

pytestmark = [pytest.mark.sglang, requires_sglang]
ARCHS = ("Qwen3MoeForCausalLM", "Glm4MoeForCausalLM")


@pytest.fixture(scope="module")
def ran() -> dict:
    return {a: run_tool_probe("sglang_moe_override_probe.py", a) for a in ARCHS}


def overrides(arch: str) -> list[dict]:
    (rules,) = [r for r in shipped_rules() if r.label == "sglang 0.5.23"]
    return list(rules.moe_backend_overrides[arch])


@pytest.mark.parametrize("arch", ARCHS)
def test_what_the_providers_pick_is_what_the_data_records(ran, arch):
    picked = ran[arch]["picked"][arch]
    assert ran[arch]["stubs_called"] == [], ran[arch]
    recorded = overrides(arch)
    chosen = {b for by_config in picked.values() for b in by_config.values() if b is not None}
    assert chosen == {o["backend"] for o in recorded}, (picked, recorded)
    assert set(picked["sm90"].values()) == {None} and all("is_sm100" in o["when"] for o in recorded), (picked, recorded)


def test_the_qwen3_moe_marlin_override_is_the_w4a16_experts_one(ran):
    """On SM100 a ModelOpt MIXED_PRECISION config with W4A16_NVFP4 experts gets marlin (which keeps the gate's global
    scale), a plain NVFP4 one flashinfer_trtllm: the data's two conditions say which by `has_w4a16_moe_layers`."""
    picked = ran["Qwen3MoeForCausalLM"]["picked"]["Qwen3MoeForCausalLM"]["sm100"]
    assert picked == {"modelopt_fp4": "flashinfer_trtllm", "modelopt_mixed": "marlin"}, picked
    when = {o["backend"]: o["when"] for o in overrides("Qwen3MoeForCausalLM")}
    assert "`has_w4a16_moe_layers`" in when["marlin"] and "`not (has_w4a16_moe_layers)`" in when["flashinfer_trtllm"], when
