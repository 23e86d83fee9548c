"""Every vLLM 0.32 model package that picks its classes per platform is profiled (and loaded) as the class a CUDA host
builds, and DeepSeek-V3.2's and GLM-5's rows are the same from either class.

- vLLM's side, in its own process: tools/vllm_gpu_stand_ins.py cuda_exports runs each package's own __init__ again
  with current_platform answering as CUDA does; for every registry architecture of such a package, the class
  cuda_classes registers (what tools/vllm_profile.py and tools/vllm_load.py build) must be that CUDA class. On this
  host models/deepseek_v32/__init__.py:17-33 falls back to deepseek_v2's generic classes (its `else:` branch, "XPU and
  CPU keep the generic implementation") where CUDA imports nvidia/model.py and nvidia/mtp.py; deepseek_v4 imports its
  `cpu` classes; hy_v4, inkling, kimi_k3, minimax_m3, qwen4_exp and deepseek_v41 import their nvidia ones on every
  platform but ROCm, glm5next its common ones: the same classes as CUDA's.
- The rows: tools/vllm_profile.py --only DeepseekV32ForCausalLM GlmMoeDsaForCausalLM builds nvidia/model.py's class;
  the same run with cuda_classes answering {} builds deepseek_v2's. Both give the shipped rows, byte for byte (the
  NVIDIA class fuses the same q_a/kv_a and indexer wk/weights_proj, nvidia/model.py:329-336, as deepseek_v2.py does),
  so doctor says nothing differently today; a release whose CUDA class builds another layer changes the CUDA run,
  which is the one the profile ships. A package whose classes here newly differ from CUDA's fails the first test
  until someone has looked at what its CUDA class builds.
- The tiny exports tests/vllm/test_generated_archs_vs_vllm.py judges doctor on (tools/vllm_arch_check.py) are built and
  loaded in nvidia/model.py's class: it registered the class this host's registry names before, so vllm_load's swap
  found nothing to replace and vLLM's loader of the generic class judged them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from .probe import REPO, VLLM_PY, requires_vllm, run_oracle
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

SHIPPED = REPO / "repair" / "targets" / "data" / "vllm-0.32.json"
DSA = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")

ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_runtime
vllm_runtime.enable_cpu_nvfp4(); vllm_runtime.torchvision_stand_in(); vllm_runtime.kernel_stand_ins()
from vllm import ModelRegistry
from vllm_gpu_stand_ins import cuda_classes, cuda_exports

def qualname(c):
    return f"{c.__module__}.{c.__qualname__}"

entries = {a: (e.module_name, e.class_name) for a, e in ModelRegistry.models.items()
           if getattr(e, "module_name", "").startswith("vllm.models.")}
exports = {p: cuda_exports(p) for p in {p for p, _ in entries.values()}}
here = {a: ModelRegistry._try_load_model_cls(a) for a in entries if exports[entries[a][0]]}
out = {}
for arch, cls in here.items():
    package, name = entries[arch]
    out[arch] = {"package": package, "here": qualname(cls), "cuda": qualname(exports[package][name]),
                 "built": qualname(cuda_classes(arch).get(arch, ModelRegistry._try_load_model_cls(arch)))}
vllm_runtime.emit(out)
"""


@pytest.fixture(scope="module")
def classes() -> dict:
    return run_oracle(ORACLE)


def test_every_platform_package_is_built_as_its_cuda_class(classes):
    assert {c["package"] for c in classes.values()} >= {"vllm.models.deepseek_v32", "vllm.models.deepseek_v4",
                                                       "vllm.models.hy_v4", "vllm.models.inkling"}, classes
    assert {a: c["built"] for a, c in classes.items() if c["built"] != c["cuda"]} == {}
    differs = {a: (c["here"], c["cuda"]) for a, c in classes.items() if c["here"] != c["cuda"]}
    nvidia = "vllm.models.deepseek_v32.nvidia.model.DeepseekV32ForCausalLM"
    assert differs["DeepseekV32ForCausalLM"] == ("vllm.model_executor.models.deepseek_v2.DeepseekV3ForCausalLM", nvidia)
    assert differs["GlmMoeDsaForCausalLM"] == ("vllm.model_executor.models.deepseek_v2.GlmMoeDsaForCausalLM", nvidia)
    assert differs["DeepseekV32MTPModel"] == ("vllm.model_executor.models.deepseek_mtp.DeepSeekMTP",
                                              "vllm.models.deepseek_v32.nvidia.mtp.DeepseekV32MTP")
    assert {classes[a]["package"] for a in differs} == {"vllm.models.deepseek_v32", "vllm.models.deepseek_v4"}, differs


def _profile(out: Path, generic: bool) -> dict:
    """tools/vllm_profile.py --only DSA in the vLLM venv; `generic`: with cuda_classes answering {} (the class this host
    imports: deepseek_v2's)."""
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    source = (f"import sys; sys.path.insert(0, {str(REPO / 'tools')!r}); import vllm_profile; "
              + ("vllm_profile.cuda_classes = lambda arch: {}; " if generic else "")
              + f"sys.exit(vllm_profile.main([{str(out)!r}, '--only', *{list(DSA)!r}]))")
    proc = subprocess.run([str(VLLM_PY), "-c", source], env=clean, cwd="/", timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_dsa_rows_from_the_generic_and_the_cuda_class_are_the_shipped_ones(tmp_path):
    cuda, generic = _profile(tmp_path / "cuda.json", False), _profile(tmp_path / "generic.json", True)
    shipped = json.loads(SHIPPED.read_text())["architectures"]
    for arch in DSA:
        assert arch in cuda["architectures"], cuda["unprofiled"]
        assert cuda["architectures"][arch] == shipped[arch], arch
        assert _sites_apart(generic["architectures"][arch]) == _sites_apart(cuda["architectures"][arch]), arch


def _sites_apart(row: dict) -> dict:
    """A row with each refusal's raising line taken out: vLLM's own words are the same from either class, but the
    generic class raises at deepseek_v2.py and the CUDA one at deepseek_v32/nvidia/model.py (`tensors_refused`)."""
    refused = {k: re.sub(r" \([\w/.]+\.py:\d+\)$", "", v) for k, v in row.get("tensors_refused", {}).items()}
    return {**row, **({"tensors_refused": refused} if refused else {})}


def test_the_tiny_dsa_exports_load_in_the_cuda_class(tmp_path):
    """tools/vllm_arch_check.py (the tiny exports tests/vllm/test_generated_archs_vs_vllm.py judges doctor on) builds and
    loads nvidia/model.py's class, not the generic one this host's registry names, and vLLM loads the healthy export."""
    lines = {line["arch"]: line for line in in_vllm("vllm_arch_check.py", tmp_path, *DSA)}
    for arch in DSA:
        assert lines[arch]["built"] == "vllm.models.deepseek_v32.nvidia.model.DeepseekV32ForCausalLM", lines[arch]
        assert lines[arch]["healthy_load"]["ok"], lines[arch]
