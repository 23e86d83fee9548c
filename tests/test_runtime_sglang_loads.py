"""SGLang's loaders on the real fixtures (issue 28 point 2): silent outcomes are errors naming the behaviour, error
texts are SGLang's per rank, and `fix --target sglang==0.5.23` gives an output doctor calls clean for it.

Loader facts (runtimes_beyond_vllm.md §1.4, probed with SGLang 0.5.23's RowParallel / MergedColumn / QKV layers):
a packed uint8 weight in a BF16 row-parallel layer is zero-padded (`pad_or_narrow_weight`), all zeros on TP rank 1;
a BF16 weight in an NVFP4 row-parallel layer is narrowed and cast into uint8; merged-column layers fail a bare
assert; tensors the built layer has no parameter for are logged as "Parameter ... not found in params_dict" and
skipped (vllm#45102: an excluded lm_head stored with its NVFP4 scales).
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import run_captured
from tests.test_runtime_sglang import SGLANG, doctor, errors, layout

LAYOUTS = {  # name -> (fixture, BF16 storage pattern or None, exclusion list or None), from the reports of §5
    "o_proj-excluded-packed": ("qwen3-32b", None, ["lm_head", "model.layers.0.self_attn.o_proj"]),
    "down_proj-bf16-declared": ("qwen3-32b", r"^model\.layers\.0\.mlp\.down_proj$|^lm_head$", None),
    "gate_up-excluded-packed": ("qwen3-32b", None, ["lm_head", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"]),
    "q_proj-wildcard": ("qwen3-32b", r"\.self_attn\.q_proj$|^lm_head$", ["lm_head", "*.self_attn.q_proj"]),  # sglang#36596
    "kv_a-excluded-q_a-packed": ("deepseek-r1", None, None),  # SGLang builds fused_qkv_a_proj_with_mqa BF16 (MLA case)
}


def lm_head_with_scales(root):
    """vllm#45102: lm_head excluded and stored BF16, but its NVFP4 scales are still in the checkpoint."""
    folder = layout(root, "qwen3-32b")
    tensors = load_file(folder / "model.safetensors")
    tensors.update({"lm_head.input_scale": torch.tensor(1.0), "lm_head.weight_scale_2": torch.tensor(0.5)})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang-loads")
    out = {name: layout(root, key, bf16, exclude) for name, (key, bf16, exclude) in LAYOUTS.items()}
    out["lm_head-scales"] = lm_head_with_scales(root)
    return out


def test_packed_weight_in_a_bf16_row_parallel_layer_loads_as_zeros_on_rank_1(folders, capsys):
    code, report = doctor(capsys, folders["o_proj-excluded-packed"], SGLANG, "--tp", "2")
    found = errors(report)["model.layers.0.self_attn.o_proj"]
    assert code == 1 and found["code"] == "silent-garbage" and found["ranks"] == [0, 1]
    assert found["message"].startswith("SGLang 0.5.23 loads this as zeros on rank 1")
    assert "Parameter model.layers.0.self_attn.o_proj.weight_scale not found in params_dict" in found["message"]
    assert report["runtime_stops_at"] == []  # nothing stops: that is the danger
    code, one = doctor(capsys, folders["o_proj-excluded-packed"], SGLANG)
    assert "zero-pads this to [64, 64]" in errors(one)["model.layers.0.self_attn.o_proj"]["message"]


def test_bf16_weight_in_an_nvfp4_row_parallel_layer_is_cast_silently(folders, capsys):
    code, report = doctor(capsys, folders["down_proj-bf16-declared"])
    found = errors(report)["model.layers.0.mlp.down_proj"]
    assert code == 1 and found["code"] == "silent-garbage" and found["runtime_error"] is None
    assert found["message"].startswith("SGLang 0.5.23 casts this BF16 weight into its packed uint8 parameter")


def test_merged_column_and_qkv_errors_per_rank_are_sglangs(folders, capsys):
    code, report = doctor(capsys, folders["gate_up-excluded-packed"], SGLANG, "--tp", "2")
    assert code == 1 and [(s["rank"], s["tensor"], s["error"]) for s in report["runtime_stops_at"]] == [
        (0, "model.layers.0.mlp.gate_proj.weight", "AssertionError"), (1, "model.layers.0.mlp.gate_proj.weight", "AssertionError")]
    assert report["schemes"]["model.layers.0.mlp.up_proj"] == "bf16"  # both shards listed: SGLang's fallback fuses them


def test_excluded_lm_head_with_scales_is_skipped_with_sglangs_log_line(folders, capsys):
    code, report = doctor(capsys, folders["lm_head-scales"])
    found = errors(report)["lm_head"]
    assert code == 1 and found["code"] == "ignored-tensors"
    assert "'Parameter lm_head.weight_scale_2 not found in params_dict', logged only" in found["message"]


def test_mla_exclusion_of_one_shard_builds_the_fused_a_proj_bf16(folders, capsys):
    """deepseek-r1 excludes kv_a_proj_with_mqa but not q_a_proj: vLLM refuses the fused layer; SGLang's
    is_layer_excluded MLA case builds fused_qkv_a_proj_with_mqa BF16, so the packed q_a_proj cannot load."""
    code, report = doctor(capsys, folders["kv_a-excluded-q_a-packed"])
    assert code == 1 and report["schemes"]["model.layers.0.self_attn.q_a_proj"] == "bf16"
    assert errors(report)["model.layers.0.self_attn.q_a_proj"]["code"] == "load-error"
    assert not any(f["code"] == "fused-shards" for f in report["findings"])
    code, vllm = doctor(capsys, folders["kv_a-excluded-q_a-packed"], "vllm==0.32.0")
    assert any(f["code"] == "fused-shards" for f in vllm["findings"])


@pytest.mark.parametrize("name", [*LAYOUTS, "lm_head-scales"])
def test_fix_for_sglang_gives_an_output_doctor_calls_clean(folders, capsys, tmp_path, name):
    code, _, err = run_captured(capsys, "fix", folders[name], "-o", tmp_path / "out", "--target", SGLANG, "--quiet")
    assert code == 0, err
    for tp in ("1", "2"):
        code, report = doctor(capsys, tmp_path / "out", SGLANG, "--tp", tp, "--strict")
        assert code == 0, [f["message"] for f in report["findings"]]
