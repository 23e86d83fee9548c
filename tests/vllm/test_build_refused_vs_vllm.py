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


KV_CACHE_BUILD = """
import sys
import vllm_profile as vp
from vllm_runtime import emit, enable_cpu_nvfp4, nvfp4_moe_emulation_fallback, torchvision_stand_in, kernel_stand_ins
from vllm_profile_configs import model_types, small_config
from vllm_gpu_stand_ins import cuda_classes
enable_cpu_nvfp4(); nvfp4_moe_emulation_fallback(); torchvision_stand_in(); kernel_stand_ins(); vp.no_triton_allocator()
arch = sys.argv[1]
cuda_classes(arch)
config = small_config(arch, model_types())[0]
base = dict(vp.QUANTIZATION)
for scheme in (None, {"dynamic": False, "num_bits": 8, "type": "float"}):
    vp.QUANTIZATION = dict(base, **({"kv_cache_scheme": scheme} if scheme else {}))
    try:
        vp.built_from(arch, config, True)
        emit({"scheme": scheme, "error": None})
    except Exception as e:
        emit({"scheme": scheme, "error": f"{type(e).__name__}: {e}"[:300]})
"""


def test_an_fp8_kv_cache_declared_in_config_lifts_deepseek_v4s_refusal(tmp_path, release):
    """The release whose profile records DeepSeek-V4 refused (0.28: its FlashMLA attention asserts an fp8 KV cache,
    attention.py:106) is asked again with ModelOpt's config.json kv_cache_scheme (FP8) added to the profile's
    quantization config: its own arg_utils.py resolves `auto` to fp8 from it, and the refusal is gone (this host then
    stops at a CUDA-only kernel, not the refusal). The profile records it as the refusal's `unless` (tools/vllm_variants.py,
    compared with the release's own run above); tests/test_build_refused.py holds doctor's side."""
    import os
    import subprocess

    from .probe import REPO, VLLM_PY

    profile = {p.label: p for p in arch.PROFILES if p.runtime == "vllm"}[f"vllm {release}"]
    refused = profile.build_refused.get("DeepseekV4ForCausalLM")
    if refused is None:
        pytest.skip(f"vllm {release} records no DeepSeek-V4 build refusal")
    script = tmp_path / "kv_cache_build.py"
    script.write_text(KV_CACHE_BUILD)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(script), "DeepseekV4ForCausalLM"], capture_output=True, text=True,
                          timeout=900, cwd="/", env={**env, "PYTHONPATH": str(REPO / "tools")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    without, declared = (json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{"))
    assert without["error"].startswith(refused["error"]), without
    assert declared["error"] is None or refused["error"] not in declared["error"], declared


KV_READING = """
import json, sys
from vllm.utils.torch_utils import get_kv_cache_quant_algo_string
for cfg in json.loads(sys.argv[1]):
    print(json.dumps(get_kv_cache_quant_algo_string(cfg)))
"""
FP8_KV = {"dynamic": False, "num_bits": 8, "type": "float"}
READ_ALIKE = [  # quantization_config values whose KV-cache dtype 0.28 reads one way and the recorded `unless` alike
    {"quant_method": "modelopt", "kv_cache_scheme": FP8_KV}, {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"},
    {"quant_method": "modelopt", "kv_cache_scheme": dict(FP8_KV, num_bits=8.0)},
    {"quant_method": "modelopt", "kv_cache_scheme": dict(FP8_KV, strategy="tensor", symmetric=True)},
    {"quant_method": "modelopt", "kv_cache_quant_algo": "fp8"}, {"quant_method": "modelopt", "kv_cache_quant_algo": "fP8"},
    {"quant_method": "modelopt_fp4", "kv_cache_scheme": FP8_KV}, {"quant_method": "modelopt_mixed", "kv_cache_quant_algo": "FP8"},
    {"quant_method": "compressed-tensors", "kv_cache_scheme": FP8_KV}, {"quant_method": "Modelopt", "kv_cache_quant_algo": "FP8"},
    {"quant_method": "modelopt", "kv_cache_scheme": dict(FP8_KV, num_bits=True)},
    {"quant_method": "modelopt", "kv_cache_scheme": dict(FP8_KV, num_bits="8")},
    {"quant_method": "modelopt", "kv_cache_scheme": dict(FP8_KV, dynamic=0)},
    {"quant_method": "modelopt", "kv_cache_scheme": {"num_bits": 8, "type": "float"}},
    {"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 4, "type": "float"}},
    {"quant_method": "modelopt", "kv_cache_quant_algo": "fp8_e4m3"}, {"quant_method": "modelopt", "kv_cache_quant_algo": "NVFP4"},
    {"quant_method": "modelopt"},
]


def kv_read(quant_configs: list[dict]) -> list[str | None]:
    """vLLM's own get_kv_cache_quant_algo_string (0.28 utils/torch_utils.py:427) on each quantization_config."""
    import os
    import subprocess

    from .probe import VLLM_PY

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", KV_READING, json.dumps(quant_configs)], capture_output=True, text=True,
                          timeout=600, cwd="/", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()[:1] in ('"', "n")]


def lifted_by_doctor(release: str, quant_config: dict) -> bool:
    from repair.doctor.refused_load import lifted

    refused = {p.label: p for p in arch.PROFILES if p.runtime == "vllm"}[f"vllm {release}"].build_refused
    return any(lifted(u, {"quantization_config": quant_config}) for u in refused["DeepseekV4ForCausalLM"]["unless"])


def test_the_recorded_fp8_kv_cache_conditions_read_as_the_releases_own_reader(release):
    """Each `unless` condition (as wide as tools/vllm_variants.py read_alike measured it) holds exactly where 0.28's own
    reader resolves an fp8 KV cache, which its DeepSeek-V4 attention takes (attention.py:106: startswith("fp8"))."""
    if "DeepseekV4ForCausalLM" not in {p.label: p for p in arch.PROFILES}[f"vllm {release}"].build_refused:
        pytest.skip(f"vllm {release} records no DeepSeek-V4 build refusal")
    for quant_config, read in zip(READ_ALIKE, kv_read(READ_ALIKE), strict=True):
        assert lifted_by_doctor(release, quant_config) is str(read).startswith("fp8"), (quant_config, read)


@pytest.mark.xfail(strict=True, reason=(
    "0.28 reads kv_cache_scheme OR ELSE kv_cache_quant_algo (torch_utils.py:439-444: the first truthy one, a string "
    "scheme lowered too), and the nested {\"quantization\": {...}} form; each recorded condition tests one field "
    "alone: an NVFP4 kv_cache_scheme beside kv_cache_quant_algo FP8 reads nvfp4 (doctor: lifted), a string "
    "kv_cache_scheme \"fp8\" and kv_cache_quant_algo \"fp8_e4m3\" (the map's value, not a key) read fp8 / auto; left: "
    "the condition form has no precedence between fields"))
def test_fields_read_in_the_releases_order(release):
    if "DeepseekV4ForCausalLM" not in {p.label: p for p in arch.PROFILES}[f"vllm {release}"].build_refused:
        pytest.skip(f"vllm {release} records no DeepSeek-V4 build refusal")
    order = [{"quant_method": "modelopt", "kv_cache_scheme": {"dynamic": False, "num_bits": 4, "type": "float"},
              "kv_cache_quant_algo": "FP8"}, {"quant_method": "modelopt", "kv_cache_scheme": "fp8"}]
    for quant_config, read in zip(order, kv_read(order), strict=True):
        assert lifted_by_doctor(release, quant_config) is str(read).startswith("fp8"), (quant_config, read)
