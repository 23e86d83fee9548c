"""Tensor-parallel resharding: per-rank checkpoints that respect NVFP4 groups, unshard, and impossible degrees."""

from __future__ import annotations

import dataclasses
import json
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from repair.codec.nvfp4 import dequantize
from repair.demo.examples import GEMMA4_31B, TINY, write_assistant
from repair.planning.model import TensorRef
from repair.tp.plan import style_plan, tensor_specs
from tests.conftest import load_tensors, raw_bytes, run_captured, run_cli, tree_hashes

SEED_TP2 = "RuntimeError: start (4096) + length (4096) exceeds dimension size (4096)."
REALISTIC = dataclasses.replace(GEMMA4_31B, vocab=4096)  # the 31B assistant's real linear shapes, small vocab
# down_proj input 96: tp=4 gives 24 features per rank, not a multiple of 16; vocab 1000 pads to 1024.
ODD = dataclasses.replace(TINY, intermediate=96, heads=4, vocab=1000)


def run(capsys, *args) -> tuple[int, str, str]:
    return run_captured(capsys, *args)


@pytest.fixture(scope="module")
def realistic(tmp_path_factory) -> tuple[Path, Path]:
    """The broken 31B-shape assistant and its standard (non-TP) fix output."""
    root = tmp_path_factory.mktemp("tp31")
    src = write_assistant(root / "broken", REALISTIC)
    _fix(src, root / "fixed")
    return src, root / "fixed"


def _fix(src: Path, out: Path, *extra: str) -> None:
    assert run_cli("fix", src, "-o", out, "--quiet", *extra) == 0


def without_report(folder: Path) -> dict[str, str]:
    return {k: v for k, v in tree_hashes(folder).items() if k != "repair_report.json"}


def rank_tensors(folder: Path, rank: int) -> dict[str, torch.Tensor]:
    with safe_open(folder / f"rank-{rank}" / "model.safetensors", "pt") as fh:
        return {k: fh.get_tensor(k) for k in fh.keys()}


def packed_modules(state: dict[str, torch.Tensor]) -> list[str]:
    return sorted(k[: -len(".weight")] for k, t in state.items()
                  if k.endswith(".weight") and t.dtype == torch.uint8 and state.get(k + "_scale") is not None)


def expected_part(full: torch.Tensor, entry: dict, rank: int, logical: bool) -> torch.Tensor:
    if entry["dim"] is None:
        return full
    lo, hi = entry["ranks"][rank]["logical" if logical else "stored"]
    return full.narrow(entry["dim"], lo, hi - lo)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_unshard_is_bitwise_the_standard_output_and_rank_slices_dequantize_exactly(capsys, realistic, tmp_path, tp):
    src, fixed = realistic
    code, out, err = run(capsys, "fix", src, "-o", tmp_path / "tp", "--tp", tp, "--quiet")
    assert code == 0, err
    assert sorted(p.name for p in (tmp_path / "tp").iterdir()) == [f"rank-{r}" for r in range(tp)] + ["repair_report.json", "tp_manifest.json"]
    assert run(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "back")[0] == 0
    assert without_report(tmp_path / "back") == without_report(fixed)

    manifest = json.loads((tmp_path / "tp" / "tp_manifest.json").read_text())
    std = load_tensors(fixed)
    assert manifest["tp"] == tp and set(manifest["tensors"]) == set(std)
    ranks = [rank_tensors(tmp_path / "tp", r) for r in range(tp)]
    for name, full in std.items():  # every tensor: the rank holds exactly its range of the stored bytes
        entry = manifest["tensors"][name]
        for r in range(tp):
            assert raw_bytes(ranks[r][name]) == raw_bytes(expected_part(full, entry, r, logical=False)), (name, r)
    modules = packed_modules(std)
    assert len(modules) == 20  # 4 layers x (q, o, gate, up, down) still packed after the default fix
    for m in modules:
        whole = dequantize(std[f"{m}.weight"], std[f"{m}.weight_scale"], std[f"{m}.weight_scale_2"])
        entry = manifest["tensors"][f"{m}.weight"]
        for r, rank in enumerate(ranks):
            part = dequantize(rank[f"{m}.weight"], rank[f"{m}.weight_scale"], rank[f"{m}.weight_scale_2"])
            assert torch.equal(part.view(torch.int16), expected_part(whole, entry, r, logical=True).view(torch.int16)), (m, r)


def test_manifest_states_styles_and_ranges_in_both_units(capsys, realistic, tmp_path):
    src, _ = realistic
    assert run(capsys, "fix", src, "-o", tmp_path / "tp", "--tp", 2, "--quiet")[0] == 0
    manifest = json.loads((tmp_path / "tp" / "tp_manifest.json").read_text())
    t = manifest["tensors"]
    down = t["model.layers.0.mlp.down_proj.weight"]
    assert (down["style"], down["dim"], down["unit"], down["logical_size"]) == ("row", 1, 2, 8192)
    assert [(r["logical"], r["stored"]) for r in down["ranks"]] == [([0, 4096], [0, 2048]), ([4096, 8192], [2048, 4096])]
    scale = t["model.layers.0.mlp.down_proj.weight_scale"]
    assert scale["unit"] == 16 and [r["stored"] for r in scale["ranks"]] == [[0, 256], [256, 512]]
    for leaf in ("weight_scale_2", "input_scale"):
        assert t[f"model.layers.0.mlp.down_proj.{leaf}"]["style"] == "replicated"
    assert t["model.layers.0.mlp.gate_proj.weight"]["style"] == "merged"
    assert [r["stored"] for r in t["model.layers.0.mlp.up_proj.weight"]["ranks"]] == [[0, 4096], [4096, 8192]]
    assert (t["pre_projection.weight"]["style"], t["pre_projection.weight"]["dim"]) == ("column", 0)
    assert (t["post_projection.weight"]["style"], t["post_projection.weight"]["dim"]) == ("row", 1)
    assert t["model.embed_tokens.weight"]["style"] == "vocab" and t["model.norm.weight"]["style"] == "replicated"
    ranks = manifest["ranks"]
    assert [r["folder"] for r in ranks] == ["rank-0", "rank-1"] and "model.safetensors" in ranks[1]["files"]
    report = json.loads((tmp_path / "tp" / "repair_report.json").read_text())
    assert report["tp"]["degree"] == 2 and {o["name"] for o in report["outputs"]} >= {"tp_manifest.json", "rank-1/model.safetensors"}


@pytest.mark.parametrize("tp, tensor, rule", [
    (3, "model.embed_tokens.weight", "not divisible by 3"),
    (128, "model.layers.0.self_attn.o_proj.weight", "32 attention heads are not divisible by 128"),
])
def test_impossible_degree_refused_before_anything_is_written(capsys, realistic, tmp_path, tp, tensor, rule):
    src, _ = realistic
    code, out, err = run(capsys, "fix", src, "-o", tmp_path / "out", "--tp", tp)
    assert code == 2 and not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    assert f"--tp {tp} is impossible: {tensor}: " in err and rule in err
    assert "degrees that work for this checkpoint: 1, 2, 4, 8, 16, 32 " in err


def test_nvfp4_group_rule_odd_vocab_and_noop_input(capsys, tmp_path):
    src = write_assistant(tmp_path / "odd", ODD, broken=False)  # already fixed: the plan is a no-op
    code, _, err = run(capsys, "fix", src, "-o", tmp_path / "tp4", "--tp", 4)
    assert code == 2 and not (tmp_path / "tp4").exists()
    assert ("--tp 4 is impossible: model.layers.0.mlp.down_proj.weight: row-parallel NVFP4: each rank's input features "
            "(96/4 = 24) must be a multiple of 16") in err and "degrees that work for this checkpoint: 1, 2 " in err
    assert run(capsys, "fix", src, "-o", tmp_path / "tp2", "--tp", 2, "--quiet")[0] == 0
    embed = json.loads((tmp_path / "tp2" / "tp_manifest.json").read_text())["tensors"]["model.embed_tokens.weight"]
    assert [r["logical"] for r in embed["ranks"]] == [[0, 512], [512, 1000]]  # padded 1024 / 2; padding not stored
    assert run(capsys, "unshard", tmp_path / "tp2", "-o", tmp_path / "back")[0] == 0
    assert without_report(tmp_path / "back") == without_report(src)  # a no-op plan: the standard output is the input


def test_doctor_tp2_prints_the_seed_error_for_rank_1(capsys, realistic):
    src, _ = realistic
    code, out, _ = run(capsys, "doctor", src, "--target", "vllm==0.22.1", "--tp", 2)
    assert code == 1
    assert f"rank 1 would stop at model.layers.0.mlp.down_proj.weight with:\n    {SEED_TP2}" in out


def test_doctor_reports_impossible_degrees_with_the_ones_that_work(capsys, realistic, tmp_path):
    src, _ = realistic
    code, out, _ = run(capsys, "doctor", src, "--target", "vllm==0.25.0", "--tp", 128, "--json")
    report = json.loads(out)
    assert code == 1 and report["runtime_stops_at"] == []  # vLLM fails building the model, before loading weights
    found = {f["subject"]: f for f in report["findings"] if f["code"] == "tp-impossible"}
    post = found["post_projection"]  # the runtime builds it NVFP4 (the config does not exclude it): 1024/128 = 8
    assert post["severity"] == "error" and "(1024/128 = 8) must be a multiple of 16" in post["message"]
    assert post["runtime_error"] == "ValueError: Unsupported model when in features size is not multiple of 16"
    assert "degrees that work: 1, 2, 4, 8, 16, 32 " in post["message"]
    assert "attention heads" in found["model.layers.0.self_attn.q_proj"]["message"]
    code, out, _ = run(capsys, "doctor", src, "--target", "vllm==0.25.0", "--tp", 3, "--json")
    embed = next(f for f in json.loads(out)["findings"] if f["subject"] == "model.embed_tokens")
    assert embed["code"] == "tp-impossible" and embed["runtime_error"] == "AssertionError: 4096 is not divisible by 3"
    odd = write_assistant(tmp_path / "odd", ODD, broken=False)
    codes = lambda t: {f["code"] for f in json.loads(run(capsys, "doctor", odd, "--target", t, "--tp", 4, "--json")[1])["findings"]}
    assert "tp-impossible" in codes("vllm==0.25.0") and "tp-impossible" not in codes("vllm==0.22.1")  # BF16 has no group rule


def test_memory_is_bounded_by_a_slice_not_the_model(realistic, tmp_path):
    from repair.io.checkpoint import open_checkpoint
    from repair.io.hashing import CHUNK
    from repair.io.dtypes import nbytes
    from repair.planning.build import make_plan
    from repair.planning.recipe import Recipe
    from repair.tp.plan import plan_tp
    from repair.tp.write import write_tp

    src, fixed = realistic
    tpp = plan_tp(make_plan(open_checkpoint(src), Recipe()), 2)
    largest_slice = max(nbytes(t.step.out.dtype, t.rank_shape(r)) for t in tpp.tensors for r in (t.spec.ranges(2) or (None,)))
    tracemalloc.start()
    write_tp(tpp, tmp_path / "tp", progress=False)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    model = (fixed / "model.safetensors").stat().st_size
    bound = largest_slice + 2 * CHUNK  # one rank's slice, plus slack (outputs are hashed through mappings, not buffers)
    assert bound < model / 3 and peak < bound, f"peak {peak / 1e6:.1f} MB, bound {bound / 1e6:.1f} MB, model {model / 1e6:.1f} MB"


def test_fallback_plans_from_transformers_or_replicated():
    refs = [TensorRef(n, d, s) for n, d, s in (
        ("model.layers.0.mlp.down_proj.weight", "U8", (64, 48)), ("model.layers.0.mlp.down_proj.weight_scale", "F8_E4M3", (64, 6)),
        ("model.layers.0.mlp.down_proj.weight_scale_2", "F32", ()), ("model.layers.0.self_attn.q_proj.weight", "BF16", (128, 64)),
        ("model.norm.weight", "BF16", (64,)))]
    styles = style_plan({"model_type": "gemma4_text"})
    assert "base_model_tp_plan of gemma4_text" in styles.source
    down, scale, scale_2, q, norm = tensor_specs(refs, styles)
    assert (down.style, down.dim, down.size, down.unit, down.blocked) == ("row", 1, 96, 2, True)
    assert (scale.size, scale.unit) == (96, 16) and scale_2.style == norm.style == "replicated"
    assert (q.style, q.dim) == ("column", 0)
    assert [r.stored for r in down.ranges(2)] == [(0, 24), (24, 48)] and down.problem(4).rule.endswith("the quantization group")
    own = style_plan({"model_type": "mine", "base_model_tp_plan": {"layers.*.mlp.down_proj": "rowwise"}})
    assert tensor_specs(refs[:1], own)[0].style == "row" and "from config.json" in own.source
    none = style_plan({"model_type": "mystery"})
    assert "every tensor is replicated" in none.source and {s.style for s in tensor_specs(refs, none)} == {"replicated"}


def test_tp_slicer_dequantizes_compressed_tensors_with_the_format_global_scale(capsys, monkeypatch, ct_export, tmp_path):
    """The slicer builds its Computer and its sliced dequantize from the plan's format, as `fix` does: a
    compressed-tensors global scale divides. `--tp` refuses compressed-tensors for its names, so the
    refusal is lifted here to reach the slicer; its dequantized slices must equal the standard fix's."""
    from repair.formats import compressed_tensors

    assert run(capsys, "fix", ct_export, "-o", tmp_path / "fixed", "--quiet")[0] == 0
    monkeypatch.setitem(compressed_tensors.UNSUPPORTED, "tp", None)
    code, _, err = run(capsys, "fix", ct_export, "-o", tmp_path / "tp", "--tp", 2, "--quiet")
    assert code == 0, err
    assert run(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "back")[0] == 0
    std = load_tensors(tmp_path / "fixed")
    dequantized = [n for n in ("pre_projection.weight", "post_projection.weight") if std[n].dtype == torch.bfloat16]
    assert dequantized == ["pre_projection.weight", "post_projection.weight"]
    back = load_tensors(tmp_path / "back")
    for name in dequantized:
        assert raw_bytes(back[name]) == raw_bytes(std[name]), name
    assert without_report(tmp_path / "back") == without_report(tmp_path / "fixed")
