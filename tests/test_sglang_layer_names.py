"""doctor and fix `--target sglang==0.5.23` apply exclusions to the names SGLang's own layers ask about (#28, sglang#24927).

SGLang 0.5.23 fuses Gemma 4's vision `self_attn.{q,k,v}_proj.linear` into one QKVParallelLinear asked about as
`...self_attn.qkv_proj` (its shards: `...self_attn.q_proj`, ...; gate/up likewise), so exclusions under the checkpoint's
`.linear` names never reach it: SGLang builds the layer NVFP4 and its loader refuses the BF16 weights ("param_data.shape
=torch.Size([32, 16]), loaded_weight.shape=torch.Size([32, 32])"). The name map is the release data's `layer_names`,
generated from SGLang's own load (tools/sglang_layer_names.py; the SGLang tier checks the data against SGLang and loads
the fix output: tests/sglang/test_layer_names_vs_sglang.py, tests/sglang/test_fix_loads_in_sglang.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_captured
from tests.sglang.reports import edit_json, gemma4_vision_k_v_packed, gemma4_vision_linear

SGLANG, VLLM = "sglang==0.5.23", "vllm==0.32.0"
VISION = "model.vision_tower.encoder.layers.0."
FUSED_SHARDS = [VISION + s for s in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj")]


def doctor(capsys, folder: Path, target: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", target, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def linear_named(tmp_path: Path) -> Path:
    """The published layout with its one other gap closed (the patch embedder, which every runtime builds NVFP4):
    vLLM reads it clean; SGLang still builds the vision q/k/v and gate/up NVFP4."""
    folder = gemma4_vision_linear(tmp_path / "in")
    edit_json(folder / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].append(
        "model.vision_tower.patch_embedder.input_proj"))
    return folder


def test_doctor_predicts_sglang_building_the_fused_vision_layers_nvfp4(tmp_path, capsys):
    folder = linear_named(tmp_path)
    assert doctor(capsys, folder, VLLM)[0] == 0
    code, report = doctor(capsys, folder, SGLANG)
    assert code == 1
    subjects = {f["subject"] for f in report["findings"] if f["severity"] == "error"}
    assert {VISION + s + ".linear" for s in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")} <= subjects
    assert {VISION + "self_attn.o_proj.linear", VISION + "mlp.down_proj.linear"}.isdisjoint(subjects)  # asked as stored
    assert report["runtime_stops_at"]


def test_fix_for_vllm_and_sglang_writes_the_names_sglang_asks(tmp_path, capsys):
    src, out = gemma4_vision_linear(tmp_path / "in"), tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(src), "-o", str(out), "--target", f"{VLLM},{SGLANG}")
    assert code == 0, err
    listed = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert set(FUSED_SHARDS) <= set(listed), listed
    before = json.loads((src / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    added = json.loads((out / "repair_report.json").read_text())["exclusions_added"]
    assert sorted(added) == sorted(set(listed) - set(before))  # the report says what the output gained, no more
    for target in (VLLM, SGLANG):
        code, text, err = run_captured(capsys, "doctor", str(out), "--target", target, "--strict")
        assert code == 0, (target, text, err)


def test_fix_for_vllm_alone_writes_no_sglang_names(tmp_path, capsys):
    """vLLM 0.32 builds Gemma 4's whole vision tower BF16 under ModelOpt NVFP4 (its generated row's modelopt_fp4_only,
    patch embedder included), so this layout needs nothing for vLLM: fix writes nothing, SGLang's names least of all.
    (From GENERIC roles it used to exclude the patch embedder, and wrote only that.)"""
    src, out = gemma4_vision_linear(tmp_path / "in"), tmp_path / "out"
    code, text, err = run_captured(capsys, "fix", str(src), "-o", str(out), "--target", VLLM)
    assert code == 0, err
    assert "nothing to fix for vllm==0.32.0" in text + err and not out.exists()


def test_fix_for_three_targets_keeps_the_names_each_one_reads(tmp_path, capsys):
    """TensorRT-LLM fnmatches entries against the checkpoint's `.linear` names and SGLang asks the shards' names: the
    output names both (the stored-name entries are not 'unused' for SGLang, whose doctor would otherwise have fix take
    them out and leave TensorRT-LLM building the vision layers NVFP4)."""
    targets = f"{VLLM},{SGLANG},trtllm==1.2.0"
    src, out = gemma4_vision_linear(tmp_path / "in"), tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(src), "-o", str(out), "--target", targets)
    assert code == 0, err
    listed = set(json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"])
    assert set(FUSED_SHARDS) | {s + ".linear" for s in FUSED_SHARDS} <= listed
    for target in targets.split(","):
        code, text, err = run_captured(capsys, "doctor", str(out), "--target", target, "--strict")
        assert code == 0, (target, text, err)


def test_fix_dequantizes_the_whole_fused_layer_sglang_builds(tmp_path, capsys):
    src, out = gemma4_vision_k_v_packed(tmp_path / "in"), tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", str(src), "-o", str(out), "--target", f"{VLLM},{SGLANG}")
    assert code == 0, err
    changed = {c["module"]: c["action"] for c in json.loads((out / "repair_report.json").read_text())["changes"]}
    assert {VISION + "self_attn.k_proj.linear", VISION + "self_attn.v_proj.linear"} <= set(changed), changed
    for target in (VLLM, SGLANG):
        code, text, err = run_captured(capsys, "doctor", str(out), "--target", target, "--strict")
        assert code == 0, (target, text, err)


def test_the_names_are_those_of_the_class_sglang_builds_not_of_the_first_listed(tmp_path, capsys):
    """SGLang 0.5.23 builds the first listed name it registers (its `registry`): an unknown name listed before
    Gemma4ForConditionalGeneration changes nothing it asks, nor anything doctor says of it."""
    plain, listed = linear_named(tmp_path / "plain"), linear_named(tmp_path / "listed")
    edit_json(listed / "config.json", lambda d: d.update(architectures=["NotARealForCausalLM", *d["architectures"]]))
    said = [{(f["code"], f["subject"]) for f in doctor(capsys, folder, SGLANG)[1]["findings"]} for folder in (plain, listed)]
    assert said[0] == said[1] and said[0], said
