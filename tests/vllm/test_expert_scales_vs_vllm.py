"""A routed expert whose up_proj weight_scale_2 differs from its gate_proj's, loaded by vLLM 0.32 itself, against
doctor's experts-gate-up-scale-2 finding and fix's repair.

Fixtures: a real ModelOpt 0.47 NVFP4 export of a tiny Qwen3-MoE (tools/modelopt_export.py, 4 experts, 2 layers), its
BF16 original (same seed), and a copy whose layer-0 expert-1 up_proj is packed from the original with its own global
scale, twice its gate_proj's (as an export that does not give the pair one scale writes it).

What vLLM 0.32 does (tools/vllm_load.py --global-scales --moe-emulation): it loads each expert's w1/w3 scales into
w13_weight_scale_2[:, 0/1], loads the model without an error, logs "w1_weight_scale_2 must match w3_weight_scale_2"
once, and keeps column 0, the gate's, for the expert's whole w13. So the split copy's up half is dequantized with the
gate's scale: half what its codes were packed with. fix --target with --original and --requantize gives the pair one
scale again; vLLM then keeps a scale that is the up's too, and the up half it loaded dequantizes to the original's
weight within NVFP4's error.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured
from .probe import REPO, VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

TARGET = "vllm==0.32.0"
EXPERT = "model.layers.0.mlp.experts.1"
LAYER = "model.layers.0.mlp.experts.routed_experts"  # the module of vLLM 0.32 holding layer 0's expert weights
WARNING = "w1_weight_scale_2 must match w3_weight_scale_2"


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from tools.modelopt_export import TINY_QWEN3_MOE, export_tiny_qwen3_moe, save_tiny_causal_lm_original

    root = tmp_path_factory.mktemp("expert-scales")
    export = export_tiny_qwen3_moe(root / "export")
    original = save_tiny_causal_lm_original("Qwen3MoeConfig", "Qwen3MoeForCausalLM", TINY_QWEN3_MOE, root / "original")
    split = root / "split"
    shutil.copytree(export, split)
    up = f"{EXPERT}.up_proj"
    for f in sorted(split.glob("*.safetensors")):
        tensors = load_file(f)
        if f"{up}.weight_scale_2" in tensors:  # up packed with its own global scale, twice the gate's
            own = tensors[f"{EXPERT}.gate_proj.weight_scale_2"] * 2
            weight, scale, scale_2 = nvfp4.quantize(stored(original, f"{up}.weight"), own)
            tensors.update({f"{up}.weight": weight, f"{up}.weight_scale": scale, f"{up}.weight_scale_2": scale_2})
            save_file(tensors, f, metadata={"format": "pt"})
    fixed = root / "fixed"
    code = subprocess.run([str(REPO / ".venv" / "bin" / "ckpt-repair"), "fix", str(split), "-o", str(fixed), "--target",
                           TARGET, "--original", str(original), "--requantize", f"{EXPERT}.up_proj", "--quiet"],
                          capture_output=True, text=True, timeout=600)
    assert code.returncode == 0, code.stderr
    return {"export": export, "original": original, "split": split, "fixed": fixed, "ct": compressed(split, root / "ct")}


def compressed(src: Path, out: Path) -> Path:
    """The split copy converted by compressed-tensors' own converter (tools/ct_export.py): weight_global_scale = 1/scale."""
    from tools.ct_export import convert_modelopt

    config = json.loads((src / "config.json").read_text())
    if "quantization_config" not in config:  # the converter reads the exclusions there
        quant = json.loads((src / "hf_quant_config.json").read_text())["quantization"]
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                         "ignore": quant.get("exclude_modules", [])}
        staged = out.with_name(out.name + "-modelopt")
        shutil.copytree(src, staged)
        (staged / "config.json").write_text(json.dumps(config))
        src = staged
    convert_modelopt(src, out)
    (out / "hf_quant_config.json").unlink(missing_ok=True)  # copied by the converter; compressed-tensors has none
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> tuple[dict[str, dict], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    names = ("export", "split", "fixed", "ct")
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_load.py"), "--global-scales", "--moe-emulation",
                           "--traceback", *(str(folders[n]) for n in names)],
                          capture_output=True, text=True, timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(zip(names, (json.loads(line) for line in proc.stdout.splitlines()))), proc.stderr


def stored(folder: Path, name: str) -> torch.Tensor:
    for f in sorted(folder.glob("*.safetensors")):
        tensors = load_file(f)
        if name in tensors:
            return tensors[name]
    raise AssertionError(name)


def up_error(folder: Path, kept: float, original: Path) -> float:
    """The up half as vLLM computes it (the stored codes and block scales, times the global scale it kept) against
    the original BF16 up_proj: relative error."""
    up = f"{EXPERT}.up_proj"
    values = nvfp4.dequantize(stored(folder, f"{up}.weight"), stored(folder, f"{up}.weight_scale"),
                              torch.tensor(kept, dtype=torch.float32)).float()
    reference = stored(original, f"{up}.weight").float()
    return float((values - reference).norm() / reference.norm())


def test_vllm_keeps_the_gates_scale_for_the_expert_as_doctor_says(loaded, folders, capsys):
    results, stderr = loaded
    split = results["split"]
    assert split["ok"], split.get("error")
    gate, up = (stored(folders["split"], f"{EXPERT}.{p}.weight_scale_2").item() for p in ("gate_proj", "up_proj"))
    moe = split["expert_scales"][LAYER]
    assert moe["w13_weight_scale_2"][1] == [gate, up] and up == 2 * gate  # loaded per shard, as stored
    assert moe["w13_kept"][1] == gate  # one scale kept for the expert: the gate's
    assert WARNING in stderr.split(str(folders["split"]), 1)[1]  # only a warning, once the split copy loads
    assert up_error(folders["split"], moe["w13_kept"][1], folders["original"]) > 0.4  # the up half: half its values
    assert up_error(folders["split"], up, folders["original"]) < 0.2  # with its own scale it would be right

    code, text, err = run_captured(capsys, "doctor", folders["split"], "--target", TARGET, "--json")
    found = [f for f in json.loads(text)["findings"] if f["code"] == "experts-gate-up-scale-2"]
    assert [f["subject"] for f in found] == [EXPERT] and "keeps the gate's (w1)" in found[0]["message"]
    code, text, err = run_captured(capsys, "doctor", folders["export"], "--target", TARGET, "--json")
    assert not [f for f in json.loads(text)["findings"] if f["code"] == "experts-gate-up-scale-2"]


def test_fixs_output_loads_with_the_up_half_correct(loaded, folders, capsys):
    results, _ = loaded
    fixed = results["fixed"]
    assert fixed["ok"], fixed.get("error")
    gate, up = fixed["expert_scales"][LAYER]["w13_weight_scale_2"][1]
    kept = fixed["expert_scales"][LAYER]["w13_kept"][1]
    assert gate == up == kept
    assert up_error(folders["fixed"], kept, folders["original"]) < 0.2  # NVFP4's own error, not a factor of two
    code, text, err = run_captured(capsys, "doctor", folders["fixed"], "--target", TARGET, "--strict")
    assert "experts-gate-up-scale-2" not in text, text


def test_a_compressed_tensors_copy_keeps_the_gates_scale_and_says_so_in_its_own_words(loaded, folders, capsys):
    """vLLM builds a compressed-tensors NVFP4 MoE with CompressedTensorsW4A4Nvfp4MoEMethod: it keeps the gate's
    weight_global_scale (column 0) too, and logs its own warning, the one doctor must quote (the profile's
    experts_gate_up_scale_2["compressed-tensors"])."""
    results, stderr = loaded
    ct = results["ct"]
    assert ct["ok"], ct.get("error")
    gate, up = (stored(folders["ct"], f"{EXPERT}.{p}.weight_global_scale").item() for p in ("gate_proj", "up_proj"))
    moe = ct["expert_scales"][LAYER]
    assert moe["w13_weight_global_scale"][1] == [gate, up] and gate == 2 * up  # 1/scale: the up's is half the gate's
    assert moe["w13_kept"][1] == pytest.approx(1 / gate, rel=1e-6)  # the gate's, inverted
    assert "w1_weight_global_scale must match w3_weight_global_scale" in stderr.split(str(folders["ct"]), 1)[1]
    code, text, err = run_captured(capsys, "doctor", folders["ct"], "--target", TARGET, "--json")
    found = [f for f in json.loads(text)["findings"] if f["code"] == "experts-gate-up-scale-2"]
    assert [f["subject"] for f in found] == [EXPERT] and "keeps the gate's (w1)" in found[0]["message"]
    assert "w1_weight_global_scale must match w3_weight_global_scale" in found[0]["message"], found[0]["message"]
