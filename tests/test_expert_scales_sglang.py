"""Routed experts' gate/up global scales under SGLang: what each release keeps is its data (tools/sglang_expert_scales.py,
read from each release's wheel). SGLang 0.5.9-0.5.11 keep the gate's on every MoE backend and log, as vLLM; 0.5.23's
ModelOpt method keeps the gate's on marlin (its default on SM80-SM9x GPUs) and on the single-alpha FlashInfer backends
(flashinfer_cutlass: its server args' pick on SM11x-SM12x for --quantization modelopt_fp4), both on flashinfer_trtllm
(its default otherwise); its compressed-tensors config picks the W4A4 scheme (the gate's) on
Blackwell and a Marlin scheme that refuses any difference below it. doctor says which, by condition; fix keeps its
promise (requantize the pair from --original, or refuse in one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.targets.runtime_rules import shipped_rules
from tests.conftest import run_captured
from tests.test_expert_scales import MOE, WARNING, compressed_tensors_moe, qwen3_moe

NEW, OLD = "sglang==0.5.23", "sglang==0.5.11"


def findings(capsys, src: Path, target: str, *args: str) -> dict[str, dict]:
    code, text, err = run_captured(capsys, "doctor", src, "--target", target, "--json", *args)
    return {f["subject"]: f for f in json.loads(text)["findings"] if f["code"] == "experts-gate-up-scale-2"}


def test_every_sglang_release_records_what_its_nvfp4_moe_keeps():
    facts = {r.label: r.experts_gate_up_scale_2 for r in shipped_rules() if r.runtime == "sglang"}
    # 0.5.14-0.5.20: the generator stops on their wheels (tests/test_sglang_release_files.py): no block, no claim
    read = {f"sglang 0.5.{n}" for n in (*range(9, 14), 21, 22, 23)}
    assert {label for label, fact in facts.items() if fact} == read, facts
    for label in ("sglang 0.5.9", "sglang 0.5.10", "sglang 0.5.11", "sglang 0.5.12", "sglang 0.5.13"):
        assert facts[label]["modelopt_fp4"]["keeps"] == "gate" and facts[label]["modelopt_fp4"]["log"] == WARNING
        assert facts[label]["compressed-tensors"]["keeps"] == "gate", facts[label]
    new = facts["sglang 0.5.23"]["modelopt_fp4"]
    keeps = {name: b["keeps"] for name, b in new["backends"].items()}
    assert keeps == {"marlin": "gate", "flashinfer_cutlass": "gate", "flashinfer_cutedsl": "gate",
                     "flashinfer_trtllm": "both", "flashinfer_trtllm_routed": "both"}, keeps
    assert new["backends"]["marlin"]["log"] == WARNING and new["option"] == "--moe-runner-backend"
    assert [d["backend"] for d in new["default"]] == ["flashinfer_cutlass", "marlin", "flashinfer_trtllm"], new["default"]
    assert "8.0 to 9.x" in new["default"][1]["when"], new["default"]
    mixed = facts["sglang 0.5.23"]["modelopt_mixed"]  # the same method; the server args' SM110/SM120 pick is fp4's only
    assert mixed["backends"] == new["backends"] and mixed["default"] == new["default"][1:], mixed
    ct = facts["sglang 0.5.23"]["compressed-tensors"]
    assert [d["backend"] for d in ct["default"]] == ["CompressedTensorsW4A4Nvfp4MoE", "CompressedTensorsW4A16Nvfp4MoE"]
    assert ct["backends"]["CompressedTensorsW4A16Nvfp4MoE"]["refuses"].startswith("ValueError: NVFP4 weight-only MoE")


def test_sglang_0_5_23_names_the_gpu_the_default_keeps_one_scale_on_and_the_backend_that_keeps_both(capsys, tmp_path):
    src = qwen3_moe(tmp_path / "src", 4, broken=(2,))
    found = findings(capsys, src, NEW)
    assert list(found) == [f"{MOE}.2"], found
    (f,) = found.values()
    message = f["message"]
    assert f["severity"] == "error", f
    assert "marlin on a CUDA GPU of compute capability 8.0 to 9.x" in message, message
    assert "9.x (Ampere, Ada, Hopper), which keeps the gate's (w1)" in message, message
    assert WARNING in message and "flashinfer_trtllm otherwise, which keeps both" in message, message
    assert "--moe-runner-backend flashinfer_trtllm or flashinfer_trtllm_routed keeps both" in message, message
    assert "asked for, flashinfer_cutedsl keeps the gate's (w1) too" in message, message
    assert findings(capsys, qwen3_moe(tmp_path / "healthy", 4, broken=()), NEW) == {}


def test_older_sglang_keeps_the_gates_on_every_backend(capsys, tmp_path):
    (f,) = findings(capsys, qwen3_moe(tmp_path / "src", 4, broken=(1,)), OLD).values()
    assert f["severity"] == "error" and "keeps the gate's (w1) for both" in f["message"] and WARNING in f["message"], f


def test_within_allclose_no_finding_where_no_default_refuses(capsys, tmp_path):
    src = qwen3_moe(tmp_path / "src", 4, broken=(1,), factor=1 + 4e-6)
    assert findings(capsys, src, NEW) == {} and findings(capsys, src, OLD) == {}


def test_compressed_tensors_under_sglang_0_5_23_refuses_below_blackwell_even_within_allclose(capsys, tmp_path):
    """Below compute capability 10.0 SGLang 0.5.23 serves a W4A4 NVFP4 MoE with CompressedTensorsW4A16Nvfp4MoE, whose
    process_weights_after_loading compares the pair exactly and raises; on Blackwell the W4A4 scheme keeps the gate's."""
    src = compressed_tensors_moe(tmp_path / "far", broken=(1,))
    (f,) = findings(capsys, src, NEW).values()
    assert f["severity"] == "error" and "CompressedTensorsW4A4Nvfp4MoE on a GPU of compute capability 10.0 or above" in f["message"]
    assert "CompressedTensorsW4A16Nvfp4MoE otherwise, which refuses to load the model (ValueError: NVFP4 weight-only" \
        in f["message"], f["message"]
    assert "--moe-runner-backend" not in f["message"] and "--requantize" not in f["message"], f["message"]
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", NEW)
    assert code == 2 and not (tmp_path / "out").exists() and len(err.strip().splitlines()) == 1, (out, err)
    near = compressed_tensors_moe(tmp_path / "near", broken=())
    assert findings(capsys, near, NEW) == {}
    tensors = load_file(near / "model.safetensors")
    gate, up = (f"{MOE}.2.{p}.weight_global_scale" for p in ("gate_proj", "up_proj"))
    tensors[up] = tensors[gate] * (1 + 4e-6)  # the premise: torch.allclose true, != true
    assert not torch.equal(tensors[gate], tensors[up]) and torch.allclose(tensors[gate], tensors[up])
    save_file(tensors, near / "model.safetensors", metadata={"format": "pt"})
    (g,) = findings(capsys, near, NEW).values()
    assert g["severity"] == "error" and "refuses to load" in g["message"] and "keeps the gate's" not in g["message"], g
    # the refusing default keeps its condition: the other default, harmless within torch.allclose, is still named
    assert "CompressedTensorsW4A4Nvfp4MoE on a GPU of compute capability 10.0 or above, which keeps one" in g["message"], g
    assert "CompressedTensorsW4A16Nvfp4MoE otherwise, which refuses" in g["message"], g
    assert findings(capsys, near, OLD) == {}  # 0.5.11 only logs outside torch.allclose


@pytest.mark.parametrize("target", [NEW, OLD])
def test_fix_for_sglang_refuses_in_one_line_without_the_original_and_requantizes_with_it(capsys, tmp_path, target):
    src = qwen3_moe(tmp_path / "src", 4, broken=(1,), original=tmp_path / "orig")
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", target)
    assert code == 2 and not (tmp_path / "out").exists(), (out, err)
    assert f"{MOE}.1" in err and "--original" in err and len(err.strip().splitlines()) == 1, err
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "fixed", "--target", target, "--original",
                                   tmp_path / "orig", "--requantize", f"{MOE}.1.up_proj")
    assert code == 0, (text, err)
    assert findings(capsys, tmp_path / "fixed", target, "--strict") == {}


def weight_only(src: Path) -> Path:
    """The compressed-tensors fixture as llm-compressor's NVFP4A16 writes it: `input_activations` null, no
    input_global_scale (SGLang 0.5.23 compressed_tensors.py `_is_fp4a16_nvfp4`)."""
    config = json.loads((src / "config.json").read_text())
    for group in config["quantization_config"]["config_groups"].values():
        group["input_activations"] = None
    (src / "config.json").write_text(json.dumps(config))
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if not k.endswith(".input_global_scale")}
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    index = src / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"] = {k: v for k, v in doc["weight_map"].items() if k in tensors}
        index.write_text(json.dumps(doc))
    return src


def test_weight_only_compressed_tensors_under_sglang_0_5_23_refuses_on_every_gpu(capsys, tmp_path):
    """SGLang 0.5.23 builds a weight-only (NVFP4A16) compressed-tensors MoE with CompressedTensorsW4A16Nvfp4MoE on every
    GPU (compressed_tensors.py get_moe_scheme's `_is_fp4a16_nvfp4` branch, no capability test), whose
    process_weights_after_loading raises when an expert's gate/up global scales differ at all: an error, not 'not
    recorded', and fix refuses in one line."""
    src = weight_only(compressed_tensors_moe(tmp_path / "far", broken=(1,)))
    (f,) = findings(capsys, src, NEW).values()
    assert f["severity"] == "error", f
    assert "CompressedTensorsW4A16Nvfp4MoE on every GPU, which refuses to load the model (ValueError: NVFP4 weight-only" \
        in f["message"], f["message"]
    assert "not recorded" not in f["message"] and "CompressedTensorsW4A4Nvfp4MoE" not in f["message"], f["message"]
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", NEW)
    assert code == 2 and not (tmp_path / "out").exists() and len(err.strip().splitlines()) == 1, (out, err)
    near = weight_only(compressed_tensors_moe(tmp_path / "near", broken=()))
    assert findings(capsys, near, NEW) == {}
    tensors = load_file(near / "model.safetensors")
    gate, up = (f"{MOE}.2.{p}.weight_global_scale" for p in ("gate_proj", "up_proj"))
    tensors[up] = tensors[gate] * (1 + 4e-6)  # within torch.allclose, still != : the scheme's own test
    save_file(tensors, near / "model.safetensors", metadata={"format": "pt"})
    (g,) = findings(capsys, near, NEW).values()
    assert g["severity"] == "error" and "refuses to load" in g["message"], g


def test_sglang_0_5_23_on_sm11x_sm12x_with_quantization_modelopt_fp4_picks_flashinfer_cutlass_which_keeps_the_gates(
        capsys, tmp_path):
    """SGLang 0.5.23's server args pick flashinfer_cutlass for modelopt_fp4 on SM110/SM120 before the method's own
    choice (arg_groups/overrides.py _moe_runner_backend_quant_constraints: `moe_runner_backend == "auto" and
    view.quantization == "modelopt_fp4" and (is_sm120 or is_sm110)`; "trtllm-gen MoE kernels are SM100-only"), and
    flashinfer_cutlass hands its kernel g1_alphas alone: there the gate's is kept silently, not both."""
    facts = {r.label: r.experts_gate_up_scale_2 for r in shipped_rules()}["sglang 0.5.23"]
    first = facts["modelopt_fp4"]["default"][0]
    assert first["backend"] == "flashinfer_cutlass" and "12.x" in first["when"] and "11.x" in first["when"], first
    assert "--quantization modelopt_fp4" in first["when"], first
    assert "flashinfer_cutlass" not in [d["backend"] for d in facts["modelopt_mixed"]["default"]], facts["modelopt_mixed"]
    (f,) = findings(capsys, qwen3_moe(tmp_path / "src", 4, broken=(2,)), NEW).values()
    assert f"flashinfer_cutlass {first['when']}, which keeps the gate's (w1) for both without rescaling" in f["message"], f


def test_a_models_own_server_arg_override_of_the_moe_backend_is_named_before_the_defaults(capsys, tmp_path):
    """SGLang 0.5.23's Qwen3-MoE family sets its own MoE runner backend on SM100 before the quant method's automatic
    choice (arg_groups/model_overrides/qwen3_moe.py: marlin where the config has W4A16_NVFP4 MoE layers,
    flashinfer_trtllm otherwise), read from the wheel (tools/sglang_moe_overrides.py): the finding names each, with
    its condition as SGLang writes it and what that backend keeps, and no longer says such overrides are not read."""
    facts = {r.label: r.moe_backend_overrides for r in shipped_rules() if r.runtime == "sglang"}
    assert all(facts[f"sglang 0.5.{n}"] == {} for n in (9, 10, 11, 12)), facts  # no model_overrides/ folder before
    qwen = facts["sglang 0.5.23"]["Qwen3MoeForCausalLM"]
    assert {o["backend"] for o in qwen} == {"marlin", "flashinfer_trtllm"}, qwen
    assert all(o["where"].startswith("sglang/srt/arg_groups/model_overrides/qwen3_moe.py:") for o in qwen), qwen
    (f,) = findings(capsys, qwen3_moe(tmp_path / "src", 4, broken=(2,)), NEW).values()
    marlin = next(o for o in qwen if o["backend"] == "marlin")
    assert f"marlin for Qwen3MoeForCausalLM where {marlin['when']}" in f["message"], f["message"]
    assert "has_w4a16_moe_layers" in marlin["when"] and "is_sm100" in marlin["when"], marlin
    assert "which keeps the gate's (w1) for both" in f["message"].split("marlin for Qwen3MoeForCausalLM")[1], f["message"]
    assert "not read here" not in f["message"] and f["severity"] == "error", f["message"]
