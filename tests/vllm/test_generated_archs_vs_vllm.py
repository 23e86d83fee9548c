"""Every architecture the shipped vLLM 0.32 profile covers, as a tiny ModelOpt NVFP4 export, judged by vLLM 0.32 (#26).

tools/vllm_arch_check.py (one process in the vLLM venv, every architecture in a loop) writes for each one a healthy
export (transformers' own checkpoint names for the profile's small config; NVFP4 exactly where vLLM builds the layer
quantized, every other layer in hf_quant_config.json's exclude_modules) and a broken copy (one more module stored
packed that vLLM builds unquantized: a router built without a quant config, else an excluded linear), then loads both
with vLLM's own loader on CPU (real weights, weights tracked) and records what vLLM decides for every module. Here:
- `inspect`'s declared state per module equals the quant method vLLM builds for it;
- `doctor --target vllm==0.32.0` exits 0 exactly when vLLM loads the folder, healthy and broken;
- `fix --target vllm==0.32.0` on the healthy export says there is nothing to fix, exits 0 and writes nothing where
  vLLM loads it; writes a copy vLLM loads where it does not; refuses in one line where no repair can (FIX_REFUSED).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import SHIPPED, in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ARCHS = sorted(json.loads(SHIPPED.read_text())["architectures"])
# architecture -> why no tiny export is written for it (the tool's reason must contain it); strict: fixed = failure here
NO_EXPORT: dict[str, str] = {}
# architecture -> vLLM's error on the BF16 checkpoint of the same config and names (no quantization): vLLM 0.32 loads
# no checkpoint of it, so the quantized export has nothing to judge. Strict: the error must be this one.
BF16_REFUSED: dict[str, str] = {
    # dbrx.py's load_weights looks up `ffn.experts.w13_weight`; its DbrxExperts is FusedMoE's `routed_experts` child,
    # whose parameters are `ffn.experts.routed_experts.w13_weight` in 0.32. The export's names are the published
    # layout (databricks/dbrx-*: `transformer.blocks.N.ffn.experts.mlp.{w1,v1,w2}`), and every expert name goes through
    # that lookup: no DBRX checkpoint loads (a vLLM 0.32 bug, not the export's layout: vllm-project/vllm#49004, whose
    # regression test feeds exactly `blocks.0.ffn.experts.mlp.w1` and expects this KeyError without the fix)
    "DbrxForCausalLM": "KeyError: 'blocks.0.ffn.experts.w13_weight'",
    # olmo_hybrid.py's WeightsMapper tags q/k/v_conv1d with a shard id (on the tensor), which olmo_gdn_linear_attn.py's
    # fused conv1d loader never reads: its `loaded_shard_id` stays None and `dims[loaded_shard_id]` raises. Separate
    # q/k/v_conv1d are the published layout (transformers' conversion_mapping.py concatenates them on load); a fused
    # `conv1d.weight` would take the same loader with the same None: no checkpoint loads (a vLLM 0.32 bug:
    # vllm-project/vllm#55858, "Fix loading allenai/Olmo-Hybrid-7B", quotes this TypeError)
    "OlmoHybridForCausalLM": "TypeError: list indices must be integers or slices, not NoneType",
}
# architecture -> what `fix --target vllm==0.32.0` says, in one line (exit 2), where vLLM fails on the healthy export, doctor
# says so, and no repair can make it load (Afmoe/ExaoneMoe: vLLM 0.32 builds lm_head with the prefix "" (its model code
# passes none), which no exclusion entry reaches, so only a quantized lm_head loads, and an NVFP4 one needs a calibrated
# input_scale).
# Strict: the refusal must say this (never "nothing to fix").
FIX_REFUSED: dict[str, str] = {
    **{a: "cannot repair lm_head: vllm==0.32.0 builds it quantized under the prefix ''"
       for a in ("AfmoeForCausalLM", "ExaoneMoeForCausalLM")},
    # laguna.py registers the routed experts' e_score_correction_bias on the FusedMoE runner
    # (`mlp.experts.routed_experts.e_score_correction_bias`), its AutoWeightsLoader finds no parameter for the
    # checkpoint's `mlp.experts.e_score_correction_bias` and drops it (`_bias` is in its ignore_unexpected_suffixes);
    # on a quantized checkpoint 0.32's track_weights_loading then names the parameter unfilled. The export is right
    # (transformers' and the published name): no change to the files makes 0.32 read it (profile: `dropped`)
    "LagunaForCausalLM": "[dropped-tensor] model.layers.1.mlp.experts.e_score_correction_bias",
}
# (architecture, "inspect" | "healthy" | "broken" | "fix") -> why `inspect`/`doctor` and vLLM 0.32 disagree today (strict xfail:
# a fix turns it into a failure here, and the entry must go). Each was found by this test.
DISAGREE: dict[tuple[str, str], str] = {}


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
    assert line["stand_in_calls"] == [], f"building or loading it called a stand-in: {line['stand_in_calls']}"
    bf16 = line.get("bf16_load") or {"ok": True}
    if arch in BF16_REFUSED:  # strict: once vLLM loads the BF16 export, the entry must go
        assert not bf16["ok"] and BF16_REFUSED[arch] in f"{bf16['error_type']}: {bf16['error']}", bf16
        if check in ("healthy", "broken"):
            pytest.skip(f"vLLM 0.32 cannot load this model's BF16 checkpoint either ({bf16['error_type']}: "
                        f"{str(bf16['error'])[:200]}): nothing about quantization to judge")
    assert bf16["ok"] or arch in BF16_REFUSED, f"vLLM 0.32 cannot load the export's BF16 layout (the tool's names): {bf16}"
    if (arch, check) in DISAGREE:
        request.applymarker(pytest.mark.xfail(strict=True, reason=DISAGREE[arch, check]))
    return line


@pytest.mark.parametrize("arch", ["Qwen4ExpForCausalLM"])
def test_qwen4exp_is_built_with_its_qsa_attention_and_calls_no_flash_attention(checked, arch, request):
    """transformers' Qwen4Exp class writes a QSA indexer into every attention layer, and with its indexer_* fields vLLM
    0.32 builds QSA attention (qwen4_exp/nvidia/model.py:243), whose backend asks whether FlashAttention exists
    (nvidia/qsa.py:252). tools/vllm_runtime.py's flash_attention_stand_in answers yes for that module only, and puts
    a placeholder that raises and is recorded in place of every FlashAttention entry point: the export is judged by
    the QSA model vLLM builds from a real checkpoint's config, and none of those was called building or loading it."""
    line = exported(checked, arch, request, "inspect")
    indexer = sorted(m for m in line["declared"] if ".self_attn.indexer." in m)
    assert indexer and not any(line["declared"][m] for m in indexer), line["declared"]
    # QSA's fused q/k/v/indexer linear takes no ModelOpt FP4 (model.py without_modelopt_fp4): stored BF16, as vLLM builds it
    assert not any(line["declared"][m] for m in line["declared"] if m.endswith(("self_attn.q_proj", "self_attn.k_proj")))
    assert line["healthy_load"]["ok"], line["healthy_load"]


def with_qsa_projections_packed(healthy: Path, folder: Path) -> list[str]:
    """A copy of the healthy Qwen4Exp export whose QSA q/k/v and indexer q/k are stored NVFP4 (ModelOpt's leaves, one
    weight_scale_2 for the four: they feed one linear) and not excluded, as a quantize-every-linear export writes
    them; the modules packed are returned."""
    shutil.copytree(healthy, folder)
    tensors = load_file(folder / "model.safetensors")
    modules = sorted(n[: -len(".weight")] for n in tensors if n.endswith(
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "indexer.index_qk_proj.weight")))
    scale_2 = max(nvfp4.global_scale(tensors[f"{m}.weight"]) for m in modules)
    for m in modules:
        packed, scale, _ = nvfp4.quantize(tensors[f"{m}.weight"], scale_2)
        tensors.update({f"{m}.weight": packed, f"{m}.weight_scale": scale, f"{m}.weight_scale_2": scale_2.clone(),
                        f"{m}.input_scale": torch.tensor(0.02)})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    quant = json.loads((folder / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] = [e for e in quant["quantization"]["exclude_modules"] if e not in modules]
    (folder / "hf_quant_config.json").write_text(json.dumps(quant, indent=1))
    return modules


@pytest.mark.parametrize("arch", ["Qwen4ExpForCausalLM"])
def test_qwen4exp_qsa_projections_stored_packed(checked, arch, request, tmp_path, capsys):
    """vLLM 0.32 builds QSA's one q/k/v/indexer linear without ModelOpt FP4 (nvidia/model.py without_modelopt_fp4), so
    the four stored packed fail its load; doctor says so for each (the profile's row, from the QSA build), and fix
    dequantizes them into a copy vLLM loads. (From the QSA-less profile doctor called them healthy.)"""
    line = exported(checked, arch, request, "broken")
    modules = with_qsa_projections_packed(Path(line["healthy"]), tmp_path / "packed")
    assert modules and any(".indexer." in m for m in modules), modules
    loaded = in_vllm("vllm_load.py", tmp_path / "packed", "--moe-emulation")[0]
    assert not loaded["ok"] and loaded["stand_in_calls"] == [], loaded
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", tmp_path / "packed", "--json")
    assert code == 1, out + err
    named = {f["subject"] for f in json.loads(out)["findings"] if f["severity"] == "error"}
    assert set(modules) <= named, (modules, named)
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", tmp_path / "packed", "-o", tmp_path / "out")
    assert code == 0, out + err
    loaded = in_vllm("vllm_load.py", tmp_path / "out", "--moe-emulation")[0]
    assert loaded["ok"] and loaded["stand_in_calls"] == [], loaded


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
    prefix vLLM matches: GraniteMoe's and Llama4's fused 3-D experts) and doctor says so, fix writes an output vLLM 0.32
    loads; where no repair can make it load (FIX_REFUSED), fix refuses in one line saying why."""
    line = exported(checked, arch, request, "fix")
    dst = tmp_path / "out"
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", line["healthy"], "-o", dst)
    if arch in FIX_REFUSED:
        assert not line["healthy_load"]["ok"], "vLLM 0.32 loads the export: take the entry out of FIX_REFUSED"
        assert run_captured(capsys, "doctor", "--target", "vllm==0.32.0", line["healthy"])[0] == 1
        assert code == 2 and FIX_REFUSED[arch] in err and len(err.strip().splitlines()) == 1 and not dst.exists(), out + err
        return
    assert code == 0, out + err
    if line["healthy_load"]["ok"] or not line.get("bf16_load", {"ok": True})["ok"]:  # or its names are not vLLM's
        assert "nothing to fix for vllm==0.32.0" in out and not dst.exists(), out
        return
    if (arch, "healthy") in DISAGREE:
        pytest.skip(f"doctor does not predict vLLM's failure on it yet: {DISAGREE[arch, 'healthy']}")
    assert dst.exists(), f"vLLM 0.32 fails on it ({line['healthy_load']['error']}) but fix writes nothing: {out}"
    loaded = in_vllm("vllm_load.py", dst, "--moe-emulation")[0]
    assert loaded["ok"], f"fix's output: vLLM 0.32 fails: {loaded['error_type']}: {loaded['error']}"
