"""doctor: each diagnosis on a fixture with exactly that defect, the seeds' errors verbatim, and fix --target."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.demo.examples import GEMMA4_31B, TINY, write_assistant
from tests.conftest import run_captured

SEED_TP1 = "RuntimeError: start (0) + length (8192) exceeds dimension size (4096)."
SEED_TP2 = "RuntimeError: start (4096) + length (4096) exceeds dimension size (4096)."


def run(capsys, *args) -> tuple[int, str]:
    code, out, _ = run_captured(capsys, *args)
    return code, out


def doctor_json(capsys, src, *args) -> tuple[int, dict]:
    code, out = run(capsys, "doctor", src, "--json", *args)
    return code, json.loads(out)


def codes(report: dict) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for f in report["findings"]:
        found.setdefault(f["code"], set()).add(f["subject"])
    return found


@pytest.fixture(scope="session")
def broken_31b(tmp_path_factory) -> Path:
    """The seeds' checkpoint: the real 31B assistant shapes (vocab 262144), every linear packed."""
    return write_assistant(tmp_path_factory.mktemp("b31") / "broken", GEMMA4_31B)


def mutate(src: Path, dst: Path, tensors=None, config=None, hf_quant=None) -> Path:
    """Copy a checkpoint, editing its tensors / config dicts through callbacks. Files are hard links (the 31B
    checkpoint is 634 MB); an edited file is unlinked first and written anew, so `src` never changes."""
    shutil.copytree(src, dst, copy_function=os.link)
    if tensors:
        state = load_file(dst / "model.safetensors")
        tensors(state)
        (dst / "model.safetensors").unlink()
        save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    for name, edit in (("config.json", config), ("hf_quant_config.json", hf_quant)):
        if edit:
            content = json.loads((dst / name).read_text())
            edit(content)
            (dst / name).unlink()
            (dst / name).write_text(json.dumps(content))
    return dst


@pytest.fixture
def healthy(tmp_path) -> Path:
    return write_assistant(tmp_path / "healthy", TINY, broken=False)


@pytest.fixture
def broken(tmp_path) -> Path:
    return write_assistant(tmp_path / "broken", TINY, broken=True)


def test_seed_errors_verbatim_on_31b_shapes(capsys, broken_31b):
    code, out = run(capsys, "doctor", broken_31b, "--target", "vllm==0.22.1")
    assert code == 1
    assert f"the runtime would stop at model.layers.0.mlp.down_proj.weight with:\n    {SEED_TP1}" in out
    code, report = doctor_json(capsys, broken_31b, "--target", "vllm==0.22.1", "--tp", "2")
    assert code == 1
    stops = {s["rank"]: s for s in report["runtime_stops_at"]}
    assert stops[1] == {"rank": 1, "tensor": "model.layers.0.mlp.down_proj.weight", "error": SEED_TP2}
    assert stops[0]["error"].startswith("AssertionError") and "load_merged_column_weight" in stops[0]["error"]


def test_vllm_025_warns_about_packed_handshake_layers(capsys, broken_31b):
    code, report = doctor_json(capsys, broken_31b, "--target", "vllm==0.25.0")
    assert code == 0 and report["runtime_stops_at"] == []
    assert codes(report) == {"handshake-quantized": {"pre_projection", "post_projection"}}
    assert run(capsys, "doctor", broken_31b, "--target", "vllm==0.25.0", "--strict")[0] == 1


def test_vllm_025_errors_when_config_excludes_packed_handshake(capsys, broken_31b, tmp_path):
    def exclude(qc):
        qc["quantization_config"]["ignore"] += ["pre_projection", "post_projection"]

    src = mutate(broken_31b, tmp_path / "excluded", config=exclude)
    code, report = doctor_json(capsys, src, "--target", "vllm==0.25.0")
    assert code == 1
    assert report["runtime_stops_at"][0]["error"] == (
        "ValueError: There is no module or parameter named 'model.post_projection.input_scale' in Gemma4MTP. "
        "The available parameters belonging to model.post_projection (RowParallelLinear) are: {'model.post_projection.weight'}"
    )
    assert {"pre_projection", "post_projection"} <= codes(report)["load-error"]
    assert {"pre_projection", "post_projection"} <= codes(report)["config-contradiction"]


def test_without_input_scale_the_narrow_error_shows(capsys, tmp_path):
    src = write_assistant(tmp_path / "w", GEMMA4_31B.__class__(**{**GEMMA4_31B.__dict__, "vocab": 512}), input_scales=False)
    mutate(src, tmp_path / "x", config=lambda c: c["quantization_config"]["ignore"].append("post_projection"))
    code, report = doctor_json(capsys, tmp_path / "x", "--target", "vllm==0.25.0", "--tp", "2")
    errors = {f["subject"]: f for f in report["findings"] if f["code"] == "load-error"}
    assert errors["post_projection"]["runtime_error"] == "RuntimeError: start (512) + length (512) exceeds dimension size (512)."
    stops = {s["rank"]: s for s in report["runtime_stops_at"]}
    assert stops[1]["tensor"] == "post_projection.weight" and stops[1]["error"] == errors["post_projection"]["runtime_error"]
    assert stops[0]["tensor"] == "post_projection.weight_scale"  # rank 0's half fits; the leftover scale then fails
    assert stops[0]["error"].startswith("ValueError: There is no module or parameter named 'model.post_projection.weight_scale'")
    assert "missing-input-scale" in codes(report)


@pytest.mark.parametrize("target", ["vllm==0.22.1", "vllm==0.25.0", "bf16"])
def test_fix_for_target_leaves_doctor_strict_clean(capsys, broken_31b, tmp_path, target):
    out = tmp_path / "fixed"
    assert run(capsys, "fix", broken_31b, "-o", out, "--target", target, "--quiet")[0] == 0
    for tp in (1, 2):
        code, text = run(capsys, "doctor", out, "--target", target, "--strict", "--tp", tp)
        assert code == 0, text
    report = json.loads((out / "repair_report.json").read_text())
    assert report["doctor"]["before"]["exit_code"] == 1 and report["doctor"]["after"]["exit_code"] == 0


def test_healthy_checkpoint_has_no_findings(capsys, healthy):
    for target in ("vllm==0.25.0", "vllm==0.32.0"):
        code, report = doctor_json(capsys, healthy, "--target", target, "--strict", "--tp", "2")
        assert code == 0 and report["findings"] == [], report["findings"]
    assert 4.5 < report["bits_per_parameter"] < 16


def test_leftover_scales_on_a_bf16_module(capsys, healthy, tmp_path):
    def add_scale(state):
        state["pre_projection.weight_scale"] = torch.ones(64, 12).to(torch.float8_e4m3fn)

    src = mutate(healthy, tmp_path / "leftover", tensors=add_scale)
    code, report = doctor_json(capsys, src, "--target", "vllm==0.25.0")
    assert code == 1
    (finding,) = [f for f in report["findings"] if f["code"] == "load-error"]
    assert finding["runtime_error"] == (
        "ValueError: There is no module or parameter named 'model.pre_projection.weight_scale' in Gemma4MTP. "
        "The available parameters belonging to model.pre_projection (ColumnParallelLinear) are: {'model.pre_projection.weight'}"
    )
    code, report = doctor_json(capsys, src, "--target", "vllm==0.22.1")
    assert "ignored-tensors" in codes(report)


@pytest.mark.parametrize("input_scales", [False, True])
def test_packed_tensor_under_a_bf16_declaration(capsys, tmp_path, input_scales):
    def drop(c):
        del c["quantization_config"]

    src = mutate(write_assistant(tmp_path / "b", TINY, input_scales=input_scales), tmp_path / "noquant", config=drop)
    (src / "hf_quant_config.json").unlink()
    code, report = doctor_json(capsys, src, "--target", "vllm==0.25.0")
    assert code == 1
    first = report["runtime_stops_at"][0]["error"]
    if input_scales:  # vLLM meets `input_scale` first (sorted names) and has no such parameter on a BF16 layer
        assert first.startswith("ValueError: There is no module or parameter named 'model.layers.0.mlp.down_proj.input_scale'")
    else:
        assert first == "RuntimeError: start (0) + length (128) exceeds dimension size (64)."
    assert "model.layers.0.mlp.down_proj" in codes(report)["config-contradiction"]


def test_bf16_tensor_declared_quantized_loads_garbage_or_fails(capsys, healthy, tmp_path):
    def unpack_down(state):
        for suffix in ("weight_scale", "weight_scale_2", "input_scale"):
            del state[f"model.layers.0.mlp.down_proj.{suffix}"]
            del state[f"model.layers.0.self_attn.q_proj.{suffix}"]
        state["model.layers.0.mlp.down_proj.weight"] = torch.zeros(64, 128, dtype=torch.bfloat16)
        state["model.layers.0.self_attn.q_proj.weight"] = torch.zeros(64, 64, dtype=torch.bfloat16)

    src = mutate(healthy, tmp_path / "bf16down", tensors=unpack_down)
    code, report = doctor_json(capsys, src, "--target", "vllm==0.25.0")
    assert code == 1
    found = codes(report)
    assert found["silent-garbage"] == {"model.layers.0.mlp.down_proj"}  # row-parallel: half the bytes fit
    assert "model.layers.0.self_attn.q_proj" in found["load-error"]  # column-parallel: shape assertion


def test_config_checks(capsys, healthy, tmp_path):
    def cfg(c):
        c["quantization_config"]["ignore"] += ["vision_tower", "model.layers.0.self_attn.q_proj"]

    src = mutate(healthy, tmp_path / "cfg", config=cfg)
    code, report = doctor_json(capsys, src, "--target", "vllm==0.25.0")
    found = codes(report)
    assert found["unused-exclusion"] == {"vision_tower"}
    assert "configs-disagree" in found
    assert "model.layers.0.self_attn.q_proj" in found["config-contradiction"]
    assert "model.layers.0.self_attn.q_proj" in found["load-error"]  # excluded, so built BF16, but stored packed


@pytest.mark.parametrize("value,problem", [(float("nan"), "is NaN"), (float("inf"), "is infinite"), (0.0, "is 0.0"), (-1.0, "is -1.0")])
def test_bad_global_scale(capsys, healthy, tmp_path, value, problem):
    src = mutate(healthy, tmp_path / "g", tensors=lambda s: s.__setitem__("model.layers.1.mlp.down_proj.weight_scale_2", torch.tensor(value)))
    code, report = doctor_json(capsys, src)
    assert code == 1
    (f,) = [f for f in report["findings"] if f["code"] == "global-scale"]
    assert f["subject"] == "model.layers.1.mlp.down_proj.weight_scale_2" and problem in f["message"]


def test_bad_block_scales(capsys, healthy, tmp_path):
    def corrupt(state):
        s = state["model.layers.0.mlp.down_proj.weight_scale"].view(torch.uint8).clone()
        s[0, 0], s[0, 1], s[0, 2] = 0x7F, 0xB8, 0x00  # NaN, negative, zero
        state["model.layers.0.mlp.down_proj.weight_scale"] = s.view(torch.float8_e4m3fn)

    code, report = doctor_json(capsys, mutate(healthy, tmp_path / "b", tensors=corrupt), "--deep")  # every byte counted
    msgs = [f["message"] for f in report["findings"] if f["code"] == "block-scales"]
    assert code == 1 and any("1 NaN and 1 negative" in m for m in msgs) and any("1 zero" in m for m in msgs)


def test_fused_siblings_with_different_global_scales(capsys, healthy, tmp_path):
    def split(state):
        state["model.layers.0.mlp.up_proj.weight_scale_2"] = state["model.layers.0.mlp.up_proj.weight_scale_2"] * 2

    src = mutate(healthy, tmp_path / "s", tensors=split)
    code, report = doctor_json(capsys, src)
    assert code == 1 and codes(report)["siblings-scale-2"] == {"model.layers.0.mlp.gate_proj, model.layers.0.mlp.up_proj"}
    # the runtime that takes the max is the target's (SGLang 0.5.23's ModelOptFp4LinearMethod.process_weights_after_loading
    # does too: weight_scale_2.max()), never vLLM named for another runtime
    for target, speaker in (("vllm==0.32.0", "vLLM"), ("sglang==0.5.23", "SGLang 0.5.23")):
        _, report = doctor_json(capsys, src, "--target", target)
        said = [f["message"] for f in report["findings"] if f["code"] == "siblings-scale-2"]
        assert said and all(f"; {speaker} takes the max" in m for m in said), (target, said)


def test_missing_input_scale(capsys, tmp_path):
    src = write_assistant(tmp_path / "w", TINY, broken=False, input_scales=False)
    code, report = doctor_json(capsys, src)
    assert code == 1 and "model.layers.0.mlp.down_proj" in codes(report)["missing-input-scale"]


def test_bf16_target_flags_quantization(capsys, healthy):
    code, report = doctor_json(capsys, healthy, "--target", "bf16")
    found = codes(report)
    assert code == 1 and "model.layers.0.mlp.down_proj" in found["not-bf16"]
    assert found["quant-config"] == {"config.json", "hf_quant_config.json"}


def test_unknown_target_is_a_usage_error(capsys, healthy):
    assert run(capsys, "doctor", healthy, "--target", "vllm==0.19.0")[0] == 2
    assert run(capsys, "doctor", healthy, "--target", "sglang")[0] == 2


def test_header_commands_never_import_torch(healthy):
    code = (
        "import sys; from repair.cli import main\n"
        "for cmd in (['inspect', sys.argv[1]], ['doctor', sys.argv[1]]):\n"
        "    try: main(cmd)\n"
        "    except SystemExit: pass\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run([sys.executable, "-c", code, str(healthy)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("edit", [
    lambda t: t.__setitem__("per_layer_config", {"1": "wide"}),
    lambda t: t.__setitem__("per_layer_config", {"1": {"head_dim": "64"}}),
    lambda t: t.__setitem__("layer_types", 7),
    lambda t: t.__setitem__("num_hidden_layers", 10**9),
])
def test_malformed_layer_config_is_one_line(capsys, healthy, tmp_path, edit):
    src = mutate(healthy, tmp_path / "cfg", config=lambda c: edit(c["text_config"]))
    for cmd in ("inspect", "doctor"):
        capsys.readouterr()
        code = run(capsys, cmd, src)[0]
        assert code == 2


@pytest.mark.parametrize("value,problem", [(float("nan"), "is NaN"), (float("inf"), "is infinite"), (0.0, "is 0.0"), (-1.0, "is -1.0")])
def test_bad_input_scale_of_a_w4a4_module(capsys, healthy, tmp_path, value, problem):
    """vLLM quantizes the module's activations with input_scale: NaN, infinite or non-positive makes every output
    garbage. doctor said 'healthy'."""
    name = "model.layers.1.mlp.down_proj.input_scale"
    src = mutate(healthy, tmp_path / "i", tensors=lambda s: s.__setitem__(name, torch.tensor(value)))
    code, report = doctor_json(capsys, src)
    assert code == 1
    (f,) = [f for f in report["findings"] if f["code"] == "input-scale"]
    assert f["subject"] == name and problem in f["message"]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float64])
def test_a_global_scale_of_another_dtype_is_said_so_not_nan(capsys, healthy, tmp_path, dtype):
    name = "model.layers.1.mlp.down_proj.weight_scale_2"
    src = mutate(healthy, tmp_path / "d", tensors=lambda s: s.__setitem__(name, s[name].to(dtype)))
    code, report = doctor_json(capsys, src)
    (f,) = [f for f in report["findings"] if f["code"] == "global-scale"]
    assert code == 1 and "NaN" not in f["message"] and "float32 scalar" in f["message"], f


def test_block_scales_of_another_dtype_are_said_so_not_counted_as_fp8(capsys, healthy, tmp_path):
    """F32 block scales of the right shape were read as fp8 bytes: '0 NaN and 115 negative block scales'."""
    name = "model.layers.1.mlp.down_proj.weight_scale"
    src = mutate(healthy, tmp_path / "d", tensors=lambda s: s.__setitem__(name, s[name].float()))
    code, report = doctor_json(capsys, src)
    found = [f for f in report["findings"] if f["subject"] == name]
    assert code == 1 and [f["code"] for f in found] == ["scale-shape"] and "F32" in found[0]["message"], found
