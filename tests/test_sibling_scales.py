"""Fused siblings' weight_scale_2 is checked on the layers the TARGET's own class fuses (its row's fused layers, from
the generated profile), not on a hand table of gate/up and q/k/v.

The config lists [HYV4ForCausalLM, HYV3ForCausalLM] (tests/test_plan_target_resolution.py): vLLM 0.32 builds HYV4,
whose packed_modules_mapping fuses q_a_proj / kv_a_proj_with_mqa into fused_qkv_a_proj and leaves q/k/v_proj apart;
vLLM 0.28 builds HYV3, which fuses q/k/v_proj into qkv_proj. Every projection is stored NVFP4, each with its own
weight_scale_2: each release's doctor names the siblings of the layer it fuses, and only those.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from repair.codec import nvfp4
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

LISTED = ["HYV4ForCausalLM", "HYV3ForCausalLM"]
QKV = ("q_proj", "k_proj", "v_proj")
MLA = ("q_a_proj", "kv_a_proj_with_mqa")


def packed(name: str, weight: torch.Tensor) -> dict[str, torch.Tensor]:
    codes, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(weight))
    return {f"{name}.weight": codes, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
            f"{name}.input_scale": torch.tensor(0.01)}


def every_projection_its_own_scale(root: Path) -> Path:
    """q/k/v and q_a/kv_a all NVFP4, module i's largest value 0.1 * (i + 1): no two share a weight_scale_2."""
    extra = {}
    for i, leaf in enumerate(QKV + MLA):
        weight = torch.zeros(32, 32, dtype=torch.bfloat16)
        weight[0, 0] = 0.1 * (i + 1)
        extra.update(packed(f"model.layers.0.self_attn.{leaf}", weight))
    export(root, LISTED[0], "hy_v3", extra, ["lm_head"])
    config = json.loads((root / "config.json").read_text())
    (root / "config.json").write_text(json.dumps({**config, "architectures": LISTED}))
    return root


def sibling_subjects(capsys, src: Path, target: str) -> set[str]:
    code, text, err = run_captured(capsys, "doctor", src, "--target", target, "--json")
    report = json.loads(text)
    return {f["subject"] for f in report["findings"] if f["code"] == "siblings-scale-2"}


@pytest.mark.parametrize("target, fused", [("vllm==0.32.0", MLA), ("vllm==0.28.0", QKV)])
def test_each_release_checks_the_siblings_its_own_class_fuses(target, fused, tmp_path, capsys):
    """0.32 (HYV4) fuses q_a/kv_a and not q/k/v: no warning on q/k/v, one on q_a/kv_a (a fused layer not named
    gate/up/q/k/v); 0.28 (HYV3) the other way round."""
    src = every_projection_its_own_scale(tmp_path / "src")
    assert sibling_subjects(capsys, src, target) == {", ".join(f"model.layers.0.self_attn.{s}" for s in fused)}


def test_side_by_side_each_target_its_own(tmp_path, capsys):
    """doctor --target a,b: each target's findings name its own fused siblings."""
    src = every_projection_its_own_scale(tmp_path / "src")
    code, text, err = run_captured(capsys, "doctor", src, "--target", "vllm==0.28.0,vllm==0.32.0", "--json")
    report = json.loads(text)
    found = {r["target"]: {f["subject"] for f in r["findings"] if f["code"] == "siblings-scale-2"} for r in report["targets"]}
    assert found == {"vllm==0.28.0": {"model.layers.0.self_attn.q_proj, model.layers.0.self_attn.k_proj, model.layers.0.self_attn.v_proj"},
                     "vllm==0.32.0": {"model.layers.0.self_attn.q_a_proj, model.layers.0.self_attn.kv_a_proj_with_mqa"}}, found


@pytest.mark.parametrize("arch, model_type, prefix", [("StableLmForCausalLM", "stablelm", "model.layers.0.self_attn"),
                                                      ("GPTJForCausalLM", "gptj", "transformer.h.0.attn")])
def test_a_layer_the_class_builds_fused_without_a_packed_mapping_is_checked(arch, model_type, prefix, tmp_path, capsys):
    """vLLM 0.32's StableLM and GPT-J build q/k/v as one QKVParallelLinear (stablelm.py, gpt_j.py) but declare no
    packed_modules_mapping, so the row's fused layers are empty; the profile's renames say what its loader stacks
    (q/k/v_proj -> qkv_proj), and that one layer keeps one global scale whatever the mapping says."""
    extra = {}
    for i, leaf in enumerate(QKV):
        weight = torch.zeros(32, 32, dtype=torch.bfloat16)
        weight[0, 0] = 0.1 * (i + 1)
        extra.update(packed(f"{prefix}.{leaf}", weight))
    src = export(tmp_path / "src", arch, model_type, extra, ["lm_head"])
    (subject,) = sibling_subjects(capsys, src, "vllm==0.32.0")
    assert sorted(subject.split(", ")) == sorted(f"{prefix}.{s}" for s in QKV)
