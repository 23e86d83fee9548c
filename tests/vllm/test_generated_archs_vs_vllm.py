"""Every architecture the shipped vLLM 0.32 profile covers, as a tiny ModelOpt NVFP4 export, judged by vLLM 0.32 (#26).

tools/vllm_arch_check.py (one process in the vLLM venv, every architecture in a loop) writes for each one a healthy
export (transformers' own checkpoint names for the profile's small config; NVFP4 exactly where vLLM builds the layer
quantized, every other layer in hf_quant_config.json's exclude_modules) and a broken copy (one more module stored
packed that vLLM builds unquantized: a router built without a quant config, else an excluded linear), then loads both
with vLLM's own loader on CPU (real weights, weights tracked) and records what vLLM decides for every module. Here:
- `inspect`'s declared state per module equals the quant method vLLM builds for it;
- `doctor --target vllm==0.32.0` exits 0 exactly when vLLM loads the folder, healthy and broken;
- `fix --target vllm==0.32.0` on the healthy export says there is nothing to fix, exits 0 and writes nothing.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import SHIPPED, in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ARCHS = sorted(json.loads(SHIPPED.read_text())["architectures"])
# architecture -> why no tiny export is written for it (the tool's reason must contain it); strict: fixed = failure here
NO_EXPORT: dict[str, str] = {
    "Gemma3nForCausalLM": "'sliding_attention' is not in list",  # transformers' class refuses the cut layer lists
    "Qwen4ExpForCausalLM": "unsupported operand type",  # transformers' class cannot be built from the small config
    "HYV3ForCausalLM": "KeyError",  # vLLM's load_weights does not know transformers' names (k_norm)
    "OlmoHybridForCausalLM": "There is no module or parameter named",  # ditto (attention_layer_norm)
}
# (architecture, "inspect" | "healthy" | "broken") -> why `inspect`/`doctor` and vLLM 0.32 disagree today (strict xfail:
# a fix turns it into a failure here, and the entry must go). Each was found by this test.
_EXPERTS_3D = ("transformers saves these experts fused (3-D) and vLLM builds them NVFP4 (no exclusion names its FusedMoE "
               "prefix), but vLLM's own load_weights fails on those BF16 tensors while the profile is generated, so the "
               "profile records no prefix for them and doctor says it loads")
_LM_HEAD_FIX = ("vLLM 0.32 builds lm_head with the prefix \"\" (no prefix), which no exclusion entry reaches, so only a "
                "quantized lm_head loads: fix would have to requantize it to NVFP4 and does not yet (it says nothing to fix)")
_LEAFLESS_FIX = ("doctor and vLLM agree these fused 3-D experts tensors (stored with no `.weight` leaf) fail, but fix "
                 "refuses in one line (exit 2): its plan takes modules with a `.weight` tensor only, so it never writes "
                 "the FusedMoE prefix `...experts` vLLM matches")
DISAGREE: dict[tuple[str, str], str] = {
    ("GptOssForCausalLM", "healthy"): _EXPERTS_3D,
    ("GraniteMoeSWAForCausalLM", "fix"): _LEAFLESS_FIX, ("Llama4ForCausalLM", "fix"): _LEAFLESS_FIX,
    ("AfmoeForCausalLM", "fix"): _LM_HEAD_FIX, ("ExaoneMoeForCausalLM", "fix"): _LM_HEAD_FIX,
    ("BloomForCausalLM", "healthy"): "vLLM's bloom.py reshapes every query_key_value tensor, the 0-d NVFP4 scales too",
    ("LagunaForCausalLM", "healthy"): "vLLM leaves the routed experts' e_score_correction_bias unfilled from this export",
}


@pytest.fixture(scope="module")
def checked(request, tmp_path_factory) -> dict[str, dict]:
    """One vLLM process for every architecture the selected tests of this module name (all of them in a full run)."""
    wanted = sorted({item.callspec.params["arch"] for item in request.session.items
                     if item.module is request.module and hasattr(item, "callspec")})
    lines = in_vllm("vllm_arch_check.py", tmp_path_factory.mktemp("generated_archs"), *wanted)
    return {line["arch"]: line for line in lines}


def exported(checked, arch: str, request, check: str) -> dict:
    line = checked[arch]
    if arch in NO_EXPORT:
        assert not line["ok"] and NO_EXPORT[arch] in line["why"], line
        pytest.skip(f"no tiny export: {line['why'][:200]}")
    assert line["ok"], line["why"]
    bf16 = line.get("bf16_load")
    if check in ("healthy", "broken") and bf16 and not bf16["ok"]:
        pytest.skip(f"vLLM 0.32 cannot load transformers' own BF16 checkpoint of it either ({bf16['error_type']}: "
                    f"{str(bf16['error'])[:200]}): its names are not vLLM's; nothing about quantization to judge")
    if (arch, check) in DISAGREE:
        request.applymarker(pytest.mark.xfail(strict=True, reason=DISAGREE[arch, check]))
    return line


@pytest.mark.parametrize("arch", ARCHS)
def test_inspect_declares_what_vllm_builds(checked, arch, request, capsys):
    line = exported(checked, arch, request, "inspect")
    code, out, err = run_captured(capsys, "inspect", line["healthy"], "--json")
    assert code == 0, err
    declared = {m["name"]: m["declared"] for m in json.loads(out)["modules"]}
    wrong = {m: (declared.get(m), "quantized" if q else "unquantized") for m, q in line["declared"].items()
             if (declared.get(m) == "quantized") != q}
    assert not wrong, f"inspect vs vLLM 0.32 (module: (declared, vLLM)): {wrong}"


@pytest.mark.parametrize("variant", ["healthy", "broken"])
@pytest.mark.parametrize("arch", ARCHS)
def test_doctor_agrees_with_vllms_loader(checked, arch, variant, request, capsys):
    line = exported(checked, arch, request, variant)
    if variant == "broken" and "broken" not in line:
        assert not any(line["declared"].values()), "a quantized export with no module chosen to store packed"
        pytest.skip("its ModelOpt export quantizes nothing (GPT-2's Conv1D layers are no nn.Linear): nothing to break")
    loaded = line[f"{variant}_load"]
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", line[variant])
    assert code in (0, 1), err
    what = f"{line.get('broken_kind')} {line.get('broken_module')} stored packed" if variant == "broken" else variant
    assert (code == 0) == loaded["ok"], (
        f"{arch} ({what}): doctor exits {code}, vLLM 0.32 "
        f"{'loads it' if loaded['ok'] else 'fails: ' + str(loaded['error_type']) + ': ' + str(loaded['error'])[:300]}"
        f"\n{out[-2000:]}")
    assert variant == "healthy" or not loaded["ok"], "the broken copy loads in vLLM: not a broken export"


@pytest.mark.parametrize("arch", ARCHS)
def test_fix_is_a_noop_on_the_healthy_export(checked, arch, tmp_path, request, capsys):
    """A no-op where vLLM loads the export; where vLLM refuses it (an exclusion naming the checkpoint module, not the
    prefix vLLM matches: GraniteMoe's fused experts) and doctor says so, fix writes an output vLLM 0.32 loads."""
    line = exported(checked, arch, request, "fix")
    dst = tmp_path / "out"
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", line["healthy"], "-o", dst)
    assert code == 0, out + err
    if line["healthy_load"]["ok"] or not line.get("bf16_load", {"ok": True})["ok"]:  # or its names are not vLLM's
        assert "nothing to fix for vllm==0.32.0" in out and not dst.exists(), out
        return
    if (arch, "healthy") in DISAGREE:
        pytest.skip(f"doctor does not predict vLLM's failure on it yet: {DISAGREE[arch, 'healthy']}")
    assert dst.exists(), f"vLLM 0.32 fails on it ({line['healthy_load']['error']}) but fix writes nothing: {out}"
    loaded = in_vllm("vllm_load.py", dst, "--moe-emulation")[0]
    assert loaded["ok"], f"fix's output: vLLM 0.32 fails: {loaded['error_type']}: {loaded['error']}"
