"""A tensor the runtime's own load_weights takes and fills nothing with (#26): vLLM 0.32's laguna.py registers the
routed experts' `e_score_correction_bias` on `mlp.experts.routed_experts` (the MoE runner) and its AutoWeightsLoader
ignores `_bias` suffixes, so the published `mlp.experts.e_score_correction_bias` goes nowhere. The profile records it
from vLLM's own load_weights and track_weights_loading (tools/vllm_dropped.py `dropped_tensors`); doctor names the
tensor, the parameter left at its initial value, and vLLM's own error where its weights check stops the load; fix
refuses in one line (no change to the files makes that release read the tensor). The vLLM tier checks the verdict
against vLLM 0.32's real loader (tests/vllm/test_generated_archs_vs_vllm.py, LagunaForCausalLM)."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from repair import arch
from repair.doctor.dropped import dropped_tensor_findings
from repair.targets.profiles import resolve
from tests.conftest import run_captured
from tools.real_fixture import write_real_model

BIAS = "model.layers.1.mlp.experts.e_score_correction_bias"
UNFILLED = "model.layers.1.mlp.experts.routed_experts.e_score_correction_bias"
VLLM_032_ERROR = f"Following weights were not initialized from checkpoint: {{'{UNFILLED}'}}"  # default_loader.py


@pytest.fixture(scope="module")
def laguna(tmp_path_factory):
    """Laguna-M.1-NVFP4's published compressed-tensors block on Laguna's own names (tools/real_fixture.py)."""
    return write_real_model(tmp_path_factory.mktemp("laguna") / "ct-laguna-moe", "ct-laguna-moe")


def findings(capsys, folder, target: str) -> tuple[int, list[dict]]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)["findings"]


@pytest.mark.parametrize("release,refused", [("vllm==0.32.0", "Following weights were not initialized from checkpoint"),
                                             ("vllm==0.30.0", None), ("vllm==0.28.0", None)])
def test_the_profile_records_the_tensor_laguna_drops(release, refused):
    row = arch.architecture({"architectures": ["LagunaForCausalLM"]}, resolve(release).release)
    [dropped] = row.dropped_tensors
    assert dropped.parameter_for("model.layers.7.mlp.experts.e_score_correction_bias") == \
        "model.layers.7.mlp.experts.routed_experts.e_score_correction_bias"
    assert dropped.refused == refused  # 0.28's and 0.30's track_weights_loading exempts the quantized MoE layer's parameters


def test_doctor_names_the_dropped_tensor_and_vllms_error(laguna, capsys):
    assert BIAS in load_file(laguna / "model.safetensors")
    code, found = findings(capsys, laguna, "vllm==0.32.0")
    dropped = [f for f in found if f["code"] == "dropped-tensor"]
    assert code == 1 and [(f["severity"], f["subject"], f["runtime_error"]) for f in dropped] == \
        [("error", BIAS, VLLM_032_ERROR)], found
    assert UNFILLED in dropped[0]["message"] and "initial value" in dropped[0]["message"]


def test_a_release_whose_check_passes_still_loses_the_tensor(laguna, capsys):
    """vLLM 0.28 loads the model with the bias at zeros: wrong routing, no error to quote."""
    code, found = findings(capsys, laguna, "vllm==0.28.0")
    dropped = [f for f in found if f["code"] == "dropped-tensor"]
    assert code == 1 and [(f["subject"], f["runtime_error"]) for f in dropped] == [(BIAS, None)], found


def test_other_runtimes_are_not_told_vllms_fact(laguna, capsys):
    assert not [f for f in findings(capsys, laguna, "sglang==0.5.23")[1] if f["code"] == "dropped-tensor"]


def test_a_checkpoint_without_the_tensor_has_no_such_finding(laguna, tmp_path, capsys):
    folder = shutil.copytree(laguna, tmp_path / "no-bias")
    tensors = load_file(laguna / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != BIAS}, folder / "model.safetensors", metadata={"format": "pt"})
    assert not [f for f in findings(capsys, folder, "vllm==0.32.0")[1] if f["code"] == "dropped-tensor"]


def test_fix_refuses_in_one_line(laguna, tmp_path, capsys):
    code, out, err = run_captured(capsys, "fix", laguna, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert code == 2 and err.count("\n") == 1 and "[dropped-tensor]" in err and BIAS in err, out + err
    assert not (tmp_path / "out").exists()


def test_on_an_unquantized_checkpoint_the_check_passes_and_the_tensor_is_still_lost(laguna, tmp_path, capsys):
    """vLLM 0.32 checks an unquantized checkpoint's weights by default, but exempts every parameter of a layer whose
    (unquantized) method post-processes weights: it loads, the bias at zeros; no error to quote."""
    bf16 = tmp_path / "bf16"
    assert run_captured(capsys, "fix", laguna, "-o", bf16, "--target", "bf16")[0] == 0
    code, found = findings(capsys, bf16, "vllm==0.32.0")
    assert [(f["subject"], f["runtime_error"]) for f in found if f["code"] == "dropped-tensor"] == [(BIAS, None)], found


@pytest.mark.parametrize("name", [BIAS + "\n", "x" + BIAS, BIAS + ".weight", "model.layers.1.mlp.gate.e_score_correction_bias"])
def test_only_the_recorded_name_is_called_dropped(name):
    """The profile's pattern is the whole name: a trailing newline (which `$` lets through) or any other name is not it."""
    row, target = arch.architecture({"architectures": ["LagunaForCausalLM"]}), resolve("vllm==0.32.0")
    assert dropped_tensor_findings([name], row, target, True) == []
    assert dropped_tensor_findings([BIAS, name], row, target, True)[0].subject == BIAS


def test_fix_refusing_for_two_kinds_of_finding_says_what_settles_each(laguna, tmp_path, capsys):
    """A dropped tensor and a missing module are each left by any plan: the line said only the first one's advice
    ("re-download or re-export"), which the user follows and then meets the dropped tensor's refusal. It says both."""
    from repair.planning.target_check import ADVICE
    from repair.doctor.findings import Kind

    folder = shutil.copytree(laguna, tmp_path / "no-o-proj")
    tensors = load_file(laguna / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if not k.startswith("model.layers.0.self_attn.o_proj.")},
              folder / "model.safetensors", metadata={"format": "pt"})
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert code == 2 and err.count("\n") == 1 and not (tmp_path / "out").exists(), out + err
    assert ADVICE[Kind.DROPPED_TENSOR] in err and ADVICE[Kind.MISSING_MODULE] in err, err
