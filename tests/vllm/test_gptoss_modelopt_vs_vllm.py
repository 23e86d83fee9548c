"""ModelOpt's own NVFP4 export of a tiny gpt-oss (tools/modelopt_gptoss_export.py: fused 3-D packed experts with
underscore scale leaves, BF16 expert biases) against vLLM 0.32's real loader (#26). vLLM builds the experts as one
NVFP4 FusedMoE layer (prefix `...mlp.experts`), which registers no bias parameters, and gpt_oss.py's load_weights
looks the checkpoint's `down_proj_bias` up as `w2_bias`: the load stops. doctor --target vllm==0.32.0 reads each 3-D
experts tensor as one packed module (formats/nvfp4_packed.py) and says so in vLLM's words (the profile's
nvfp4_load_refused, recorded by feeding ModelOpt's names through gpt_oss.py's load_weights); fix dequantizes the experts
to transformers' BF16 layout and excludes `...mlp.experts`, which vLLM builds unquantized, biases and all."""

from __future__ import annotations

import hashlib

import pytest
import torch

from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

VLLM_ERROR = ("KeyError", "'layers.0.mlp.experts.w2_bias'")  # gpt_oss.py _load_weights_other: params_dict[name]


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    from tools.modelopt_gptoss_export import export_gpt_oss

    return export_gpt_oss(tmp_path_factory.mktemp("gptoss") / "modelopt-gpt-oss")


def test_vllm_refuses_modelopts_gpt_oss_export_and_doctor_says_why_in_its_words(export, capsys):
    loaded = in_vllm("vllm_load.py", export, "--moe-emulation")[0]
    assert (loaded["ok"], loaded["error_type"], loaded["error"]) == (False, *VLLM_ERROR), loaded
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", export)
    assert code == 1 and "{}: {}".format(*VLLM_ERROR) in out and "stored u8" not in out, out + err


def test_fix_output_loads_in_vllm_with_the_experts_bf16_and_their_biases(export, tmp_path, capsys):
    from safetensors.torch import load_file

    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", export, "-o", tmp_path / "out")
    assert code == 0, out + err
    loaded = in_vllm("vllm_load.py", tmp_path / "out", "--moe-emulation", "--hash")[0]
    assert loaded["ok"], loaded
    assert {m["method"] for k, m in loaded["methods"].items() if k.endswith("routed_experts")} == {"UnquantizedFusedMoEMethod"}
    stored = load_file(tmp_path / "out" / "model.safetensors")
    for layer in range(2):
        for leaf, param in (("gate_up_proj_bias", "w13_bias"), ("down_proj_bias", "w2_bias")):
            want = hashlib.sha256(stored[f"model.layers.{layer}.mlp.experts.{leaf}"].view(torch.uint8).numpy().tobytes()).hexdigest()
            assert loaded["params"][f"model.layers.{layer}.mlp.experts.routed_experts.{param}"]["sha256"] == want
