"""A real ModelOpt MIXED_PRECISION export (tools/modelopt_mixed_export.py) in vLLM 0.32's real loader on CPU, as
exported and after `fix --target bf16` (issue 19).

Fixtures (ModelOpt 0.47 exports of one tiny Llama, calibrated on CPU):
  mixed      FP8 attention, NVFP4 / W4A16_NVFP4 / NVFP4_AWQ MLPs, one excluded o_proj, FP8 KV cache (the issue's mix)
  nvfp4-fp8  the same with layer 1's MLP NVFP4 and no AWQ (w4a16=False, awq=False): schemes vLLM has on CPU but FP8
  awq        w4a16=False only: the NVFP4_AWQ layer is the one vLLM cannot serve
  mixed-bf16 the project's `fix --target bf16` of `mixed`

What vLLM 0.32 cannot build on this CPU host (kernel availability, not checkpoint properties), so these loads stop:
  - W4A16_NVFP4 linears: its NVFP4 kernel selection forces MarlinNvFp4LinearKernel for weight-only ("Marlin FP4 not
    available"), while the model is being built;
  - FP8 per-tensor linears: process_weights_after_loading requantizes q/k/v to one scale with the custom op
    `_C::static_scaled_fp8_quant`, which the CPU build of vLLM's _C does not register.
There the scheme vLLM selects per layer (tools/vllm_mixed_schemes.py: vLLM's own ModelOptMixedPrecisionConfig.
get_quant_method per Llama linear) is checked against doctor's per-layer prediction (`doctor --json` "schemes").
The NVFP4_AWQ layer has no vLLM linear method: vLLM builds it unquantized and its packed tensors stop the load, as
doctor reports. The bf16 fix output loads fully and exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from .probe import REPO, VLLM_PY, read_all, requires_vllm
from .test_llama_vs_vllm import assert_loaded_exactly, ckpt_repair, doctor_json, vllm_layout, vllm_load

pytestmark = [pytest.mark.vllm, requires_vllm]

SCHEMES = REPO / "tools" / "vllm_mixed_schemes.py"
TARGET = "vllm==0.32.0"
SHARDS = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj", "up_proj": "gate_up_proj"}
NO_W4A16_CPU_KERNEL = "Forced NVFP4 kernel MarlinNvFp4LinearKernel is not supported: Marlin FP4 not available"
NO_FP8_CPU_KERNEL = "_C::static_scaled_fp8_quant() expected at most 0 argument(s) but received 4 argument(s)"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from tools.modelopt_mixed_export import export_mixed_llama

    root = tmp_path_factory.mktemp("mixed_vllm")
    out = {"mixed": export_mixed_llama(root / "mixed"),
           "nvfp4-fp8": export_mixed_llama(root / "nvfp4-fp8", w4a16=False, awq=False),
           "awq": export_mixed_llama(root / "awq", w4a16=False)}
    out["mixed-bf16"] = root / "mixed-bf16"
    fixed = ckpt_repair("fix", out["mixed"], "-o", out["mixed-bf16"], "--target", "bf16", "--quiet")
    assert fixed.returncode == 0, fixed.stderr
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> dict[str, dict]:
    names = list(folders)
    return dict(zip(names, vllm_load([folders[n] for n in names])))


@pytest.fixture(scope="module")
def selected(folders) -> dict[str, dict]:
    """tools/vllm_mixed_schemes.py over the three exports: vLLM prefix -> what vLLM's config gives that linear."""
    names = ["mixed", "nvfp4-fp8", "awq"]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(SCHEMES), *(str(folders[n]) for n in names)], capture_output=True,
                          text=True, timeout=600, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {n: json.loads(line)["layers"] for n, line in zip(names, proc.stdout.splitlines())}


def as_token(choice: dict) -> str:
    """vLLM's choice in doctor's vocabulary: bf16, fp8, nvfp4 (W4A4), w4a16_nvfp4 (weight-only NVFP4)."""
    if choice["method"] == "UnquantizedLinearMethod":
        return "bf16"
    scheme = {"KFp8StaticTensor": "fp8", "KNvfp4Static": "nvfp4"}[choice["scheme"]]
    return "w4a16_nvfp4" if scheme == "nvfp4" and choice["activation"] is None else scheme


def doctor_prediction(folder: Path) -> tuple[dict[str, str], dict]:
    """(doctor's per-layer scheme for vLLM 0.32 by vLLM prefix, its --json report); the shards of a fused layer agree."""
    report = doctor_json(folder, TARGET)
    by_prefix: dict[str, set[str]] = defaultdict(set)
    for name, scheme in report["schemes"].items():
        parent, _, proj = name.rpartition(".")
        if proj.endswith("_proj"):
            by_prefix[f"{parent}.{SHARDS.get(proj, proj)}"].add(scheme)
    assert all(len(v) == 1 for v in by_prefix.values()), by_prefix
    return {k: v.pop() for k, v in by_prefix.items()}, report


def test_mixed_export_stops_at_a_scheme_without_a_cpu_kernel(loaded):
    """W4A16_NVFP4 (layer 1's MLP) has no NVFP4 weight-only kernel on CPU; without it, FP8 has no requantize op."""
    assert not loaded["mixed"]["ok"] and NO_W4A16_CPU_KERNEL in loaded["mixed"]["error"]
    assert not loaded["nvfp4-fp8"]["ok"] and NO_FP8_CPU_KERNEL in loaded["nvfp4-fp8"]["error"]


@pytest.mark.parametrize("name", ["mixed", "nvfp4-fp8", "awq"])
def test_scheme_vllm_selects_per_layer_is_doctors_prediction(selected, folders, name):
    got = {prefix: as_token(choice) for prefix, choice in selected[name].items()}
    assert got == doctor_prediction(folders[name])[0]
    assert set(got.values()) >= {"fp8", "nvfp4", "bf16"}  # the excluded o_proj is bf16 in every variant
    if name == "mixed":
        assert got["model.layers.1.mlp.gate_up_proj"] == got["model.layers.1.mlp.down_proj"] == "w4a16_nvfp4"
    if name != "nvfp4-fp8":
        assert got["model.layers.2.mlp.down_proj"] == "bf16"  # NVFP4_AWQ: no vLLM linear method


def test_nvfp4_awq_layer_built_unquantized_stops_the_load(loaded, folders):
    """vLLM builds the NVFP4_AWQ down_proj as a plain BF16 linear and stops at its first packed tensor (a stored scale
    names a parameter that BF16 layer does not have); doctor predicts the BF16 build and reports that layer, alone."""
    result = loaded["awq"]
    assert not result["ok"] and result["error_type"] == "ValueError"
    assert result["error"].startswith("There is no module or parameter named 'layers.2.mlp.down_proj.")
    schemes, report = doctor_prediction(folders["awq"])
    assert schemes["model.layers.2.mlp.down_proj"] == "bf16" and report["exit_code"] == 1
    assert [(f["severity"], f["subject"]) for f in report["findings"]] == [("error", "model.layers.2.mlp.down_proj")]


def test_bf16_fix_loads_fully_with_modelopts_dequantization(loaded, folders):
    """`fix --target bf16`: vLLM reads no quantization, builds every layer unquantized, and loads exactly ModelOpt's
    own BF16 dequantization of every algorithm (NVFP4, W4A16_NVFP4, FP8, NVFP4_AWQ folded); doctor agrees."""
    from tests.test_mixed_modelopt_export import module_tensors, modelopt_bf16

    export = read_all(folders["mixed"])
    declared = {k: v["quant_algo"] for k, v in
                json.loads((folders["mixed"] / "hf_quant_config.json").read_text())["quantization"]["quantized_layers"].items()}
    expected = {n: t for n, t in export.items() if n.rpartition(".")[0] not in declared and not n.endswith(("k_scale", "v_scale"))}
    expected.update({f"{layer}.weight": modelopt_bf16(module_tensors(export, layer), algo) for layer, algo in declared.items()})
    result = loaded["mixed-bf16"]
    assert_loaded_exactly(result, vllm_layout(expected))
    assert result["quantization"] is None
    assert {v["method"] for v in result["methods"].values()} == {"UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"}
    report = doctor_json(folders["mixed-bf16"], TARGET)
    assert report["exit_code"] == 0 and report["findings"] == []
