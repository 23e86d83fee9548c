"""The MLA architectures' rows of the venv's own vLLM release, judged by that release's loader (run with
VLLM_VENV=/work/venvs/vllm-0.28 for 0.28, whose rows tools/vllm_gpu_stand_ins.py mla_prefill_stand_in lets the
generator build; the default venv judges 0.32's).

- tools/vllm_arch_check.py's tiny ModelOpt NVFP4 export of each (healthy, and broken: its router stored packed):
  `doctor --target vllm==RELEASE` exits 0 exactly when vLLM loads it, and no stand-in was called;
- DeepSeek-R1's published layout (tools/real_fixture.py: kv_a_proj_with_mqa excluded, q_a_proj not): vLLM refuses
  it while building, in the words doctor quotes for the layer it names (the generic row said nothing for 0.28).
"""

from __future__ import annotations

import json

import pytest

from tools.real_fixture import write_real_model

from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

MLA = ("AXK1ForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM",
       "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "LongcatFlashForCausalLM")
# A.X K1's export: transformers' class given mlp_layer_types null, so that it lays layers out by first_k_dense_replace
# (0: all MoE) as vLLM's own AXK1Config reads it (tools/vllm_profile_configs.py PUBLISHED; 0.28's loader had refused
# the dense layer 0 transformers 5.25 wrote: KeyError 'layers.0.mlp.down_proj.weight')


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, dict]:
    return {line["arch"]: line for line in in_vllm("vllm_arch_check.py", tmp_path_factory.mktemp("mla"), *MLA)}


@pytest.mark.parametrize("variant", ["healthy", "broken"])
@pytest.mark.parametrize("arch", MLA)
def test_doctor_agrees_with_the_releases_loader(checked, release, arch, variant, capsys):
    line = checked[arch]
    assert line["ok"] and line["stand_in_calls"] == [], line
    loaded = line[f"{variant}_load"]
    assert variant == "healthy" or not loaded["ok"], "the broken copy loads: not a broken export"
    # on an AMX host vllm_load.py asks for vLLM's reference CPU MLA backend (tools/vllm_gpu_stand_ins.py
    # reference_mla_backend): AMX_MLA's prepack refuses the small config's 16-wide heads after loading
    assert "invalid weight input features" not in str(loaded.get("error")), loaded
    code, out, err = run_captured(capsys, "doctor", "--target", f"vllm=={release}", line[variant])
    assert code in (0, 1) and (code == 0) == loaded["ok"], (arch, variant, loaded, out[-2000:])


def test_r1_layout_is_refused_in_the_words_doctor_quotes(release, tmp_path, capsys):
    folder = write_real_model(tmp_path / "r1", "deepseek-r1")
    [loaded] = in_vllm("vllm_load.py", folder, "--moe-emulation")
    assert not loaded["ok"] and loaded["stand_in_calls"] == [], loaded
    code, out, err = run_captured(capsys, "doctor", "--target", f"vllm=={release}", "--json", folder)
    stops = json.loads(out)["runtime_stops_at"]
    assert code == 1 and stops and f"{loaded['error_type']}: {loaded['error']}" == f"ValueError: {stops[0]['error']}", (
        loaded, stops)
