"""ModelOpt's own NVFP4 export of a tiny gpt-oss (tools/modelopt_gptoss_export.py: fused 3-D packed experts with
underscore scale leaves, BF16 expert biases) against vLLM 0.32's real loader (#26). vLLM builds the experts as one
NVFP4 FusedMoE layer (prefix `...mlp.experts`), which registers no bias parameters, and gpt_oss.py's load_weights
looks the checkpoint's `down_proj_bias` up as `w2_bias`: the load stops. doctor --target vllm==0.32.0 must not call
it loadable (main did: "0 error(s)"), and fix must refuse in one line rather than write something vLLM refuses.
Its reason is not vLLM's yet: doctor reads the underscore-leaf 3-D experts as a u8 layer vLLM builds NVFP4 under the
FusedMoE prefix the profile now records; the bias refusal (KeyError) is not in the profile."""

from __future__ import annotations

import pytest

from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

VLLM_ERROR = ("KeyError", "'layers.0.mlp.experts.w2_bias'")  # gpt_oss.py _load_weights_other: params_dict[name]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from tools.modelopt_gptoss_export import export_gpt_oss

    return export_gpt_oss(tmp_path_factory.mktemp("gptoss") / "modelopt-gpt-oss")


def test_vllm_refuses_modelopts_gpt_oss_export_and_doctor_says_it_does_not_load(export, capsys):
    loaded = in_vllm("vllm_load.py", export, "--moe-emulation")[0]
    assert (loaded["ok"], loaded["error_type"], loaded["error"]) == (False, *VLLM_ERROR), loaded
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", export)
    assert code == 1, out + err


def test_fix_refuses_it_in_one_line(export, tmp_path, capsys):
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", export, "-o", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists(), out + err
