"""Attacks on `fix` for ModelOpt MIXED_PRECISION checkpoints, each found by hand first.

Checkpoints: tests/mixed_helpers.py's healthy 2-layer Llama (ModelOpt's own converter writes config.json) and
tools/real_fixture.py write_qwen36 (the published Qwen3.6 MoE layout). Facts about vLLM 0.32 are checked in
its own venv by ModelOptMixedPrecisionConfig (tests/vllm/test_fix_mixed_vs_vllm.py): a fused layer (qkv_proj,
gate_up_proj) resolves to the algorithm of the shards still listed in quantized_layers, and one routed expert
in the exclusion list excludes the whole routed-experts layer (quant_utils.is_layer_skipped, "experts" case).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import load_tensors, read_json, run_captured
from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed

AWQ = "model.layers.1.mlp.down_proj"
EXPERT = "model.language_model.layers.0.mlp.experts.0.gate_proj"
EXPERTS = "model.language_model.layers.0.mlp.experts"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("attack-fix") / "healthy")


@pytest.fixture
def qwen36(qwen36_export) -> Path:
    return qwen36_export


def recipe(tmp_path: Path, *modules: str) -> Path:
    path = tmp_path / "r.toml"
    path.write_text('name = "part"\n[[rules]]\naction = "dequantize"\nmodules = [' + ", ".join(f'"{m}"' for m in modules) + "]\n")
    return path


def refused(capsys, *args) -> str:
    code, out, err = run_captured(capsys, *args)
    assert code == 2 and out == "" and err.count("\n") == 1, (code, out, err)
    return err


def exclude(folder: Path, name: str) -> None:
    """Add `name` to both files' exclusion lists (a careless hand edit: the layer stays stored quantized)."""
    for file, key, field in (("config.json", "quantization_config", "ignore"), ("hf_quant_config.json", "quantization", "exclude_modules")):
        data = read_json(folder / file)
        data[key][field] = list(data[key].get(field) or []) + [name]
        (folder / file).write_text(json.dumps(data))


@pytest.mark.parametrize("module, fused", [("model.layers.0.self_attn.q_proj", "k_proj"), ("model.layers.0.mlp.up_proj", "gate_proj")])
def test_dequantizing_one_shard_of_a_fused_layer_is_refused(capsys, healthy, tmp_path, module, fused):
    """q_proj alone back to BF16 left k_proj / v_proj FP8 in quantized_layers: vLLM resolves the fused qkv_proj by
    the shards it still finds (FP8) and loads q_proj's BF16 weight into an FP8 parameter. fix wrote it, exit 0."""
    err = refused(capsys, "fix", healthy, "-o", tmp_path / "out", "--recipe", recipe(tmp_path, module), "--dry-run")
    assert module in err and fused in err and "one fused layer" in err
    assert not (tmp_path / "out").exists()


def test_dequantizing_one_routed_expert_is_refused(capsys, qwen36, tmp_path):
    """One expert back to BF16 was excluded by name; vLLM then excludes the whole routed-experts layer and builds it
    unquantized, so every other expert's W4A16_NVFP4 tensors cannot load. fix wrote it and doctor called it clean."""
    err = refused(capsys, "fix", qwen36, "-o", tmp_path / "out", "--recipe", recipe(tmp_path, EXPERT))
    assert EXPERT in err and EXPERTS in err and "routed experts" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [0.0, -1.0], ids=["zero", "negative"])
def test_a_pre_quant_scale_that_is_not_positive_is_refused_at_plan_time(capsys, tmp_path, value):
    """ModelOpt's AWQ scales are clamped to [1e-4, 1e4] and normalised by a positive factor: a zero or negative one
    is a broken export. Both folded silently (exit 0, an input channel erased or negated). (NaN / inf ones are
    refused by the writer's guard on the folded weight: test_fix_mixed.py test_nan_results_are_refused_not_written.)"""
    tensors = tensors_for(healthy_layers())
    scale = tensors[f"{AWQ}.pre_quant_scale"].clone()
    scale[5] = value
    tensors[f"{AWQ}.pre_quant_scale"] = scale
    src = write_mixed(tmp_path / "src", tensors=tensors)
    for args in (("--target", "bf16", "--dry-run"), ("--target", "vllm==0.32.0")):
        err = refused(capsys, "fix", src, "-o", tmp_path / "out", *args)
        assert f"{AWQ}.pre_quant_scale" in err and "pre_quant_scale" in err and "column 5" in err
    assert not (tmp_path / "out").exists()


def _contradicted_fused(tmp_path: Path) -> Path:
    """The healthy model with q_proj (stored FP8) named in the exclusion lists."""
    src = write_mixed(tmp_path / "src")
    exclude(src, "model.layers.0.self_attn.q_proj")
    return src


def _contradicted_expert(qwen36: Path, tmp_path: Path) -> Path:
    import shutil

    src = tmp_path / "src"
    shutil.copytree(qwen36, src)
    exclude(src, EXPERT)
    return src


def test_target_fix_dequantizes_the_whole_fused_layer(capsys, tmp_path):
    """--target derives q_proj alone (the config excludes it, its tensors are FP8); the plan takes the fused layer."""
    src = _contradicted_fused(tmp_path)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, err
    out = load_tensors(tmp_path / "out")
    for proj in ("q_proj", "k_proj", "v_proj"):
        assert out[f"model.layers.0.self_attn.{proj}.weight"].dtype == torch.bfloat16, proj


def test_target_fix_dequantizes_the_whole_routed_layer(capsys, qwen36, tmp_path):
    src = _contradicted_expert(qwen36, tmp_path)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, err
    out = load_tensors(tmp_path / "out")
    experts = [n for n in out if n.startswith(EXPERTS + ".") and n.endswith("_proj.weight")]
    assert len(experts) == 12 and all(out[n].dtype == torch.bfloat16 for n in experts)
    assert not [n for n in out if n.startswith(EXPERTS + ".") and not n.endswith(".weight")]


def test_a_runtime_target_drops_kv_scales_nothing_declares(capsys, tmp_path):
    """k_scale / v_scale stored with no KV-cache declaration: doctor --strict warns for vLLM (the runtime ignores or
    refuses them), yet `fix --target vllm==0.32.0` kept them and exited 0 with the warning left. Now it drops them
    (the change doctor asks for), doctor --strict is clean, and fixing the output again changes nothing."""
    layers = {n: "NVFP4" if a == "NVFP4_AWQ" else a for n, a in healthy_layers().items()}
    src = write_mixed(tmp_path / "src", layers, kv=False, kv_scales=True)
    assert run_captured(capsys, "doctor", src, "--strict", "--target", "vllm==0.32.0")[0] == 1
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert code == 0, err
    assert "4 k_scale / v_scale tensor(s) dropped (model.layers.0.self_attn.k_proj.k_scale, ...): no KV-cache quantization is declared" in text
    out = load_tensors(tmp_path / "out")
    src_tensors = load_tensors(src)
    assert sorted(out) == sorted(n for n in src_tensors if not n.endswith(("k_scale", "v_scale")))
    assert read_json(tmp_path / "out" / "config.json") == read_json(src / "config.json")
    code, text, _ = run_captured(capsys, "doctor", tmp_path / "out", "--strict", "--target", "vllm==0.32.0")
    assert code == 0, text
    code, text, _ = run_captured(capsys, "fix", tmp_path / "out", "-o", tmp_path / "again", "--target", "vllm==0.32.0")
    assert code == 0 and "nothing to fix" in text and not (tmp_path / "again").exists()


def test_bf16_target_does_not_claim_a_kv_declaration_it_did_not_find(capsys, tmp_path):
    """--target bf16 on undeclared KV scales said it removed 'the KV-cache declaration (kv_cache_quant_algo /
    kv_cache_scheme)', which the checkpoint never had."""
    src = write_mixed(tmp_path / "src", kv=False, kv_scales=True)
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "bf16", "--dry-run")
    assert code == 0, err
    assert "k_scale / v_scale tensor(s) dropped" in text and "KV-cache declaration" not in text


def test_a_recipe_dequantizing_every_declared_layer_is_refused_not_an_internal_error(capsys, healthy, tmp_path):
    """`dequantize *` without dropping the quantization config left MIXED_PRECISION with an empty quantized_layers,
    which vLLM refuses: our own output check caught it as an internal error (exit 3). It is the recipe's doing."""
    err = refused(capsys, "fix", healthy, "-o", tmp_path / "out", "--recipe", recipe(tmp_path, "*"))
    assert "quantized_layers" in err and "--target bf16" in err and "internal error" not in err
    assert not (tmp_path / "out").exists()


def test_target_fix_repairs_fused_shards_declared_in_different_algorithms(capsys, tmp_path):
    """q_proj FP8, k_proj NVFP4, v_proj FP8: doctor --strict reports vLLM's own 'Mixed quant_algo within fused layer'
    error, yet `fix --target vllm==0.32.0` said 'nothing to fix' (exit 0). Dequantizing the fused layer whole is
    the repair: every shard BF16 and out of quantized_layers, the other layers untouched."""
    layers = dict(healthy_layers(), **{"model.layers.0.self_attn.k_proj": "NVFP4", AWQ: "NVFP4"})
    src = write_mixed(tmp_path / "src", layers, tensors=tensors_for(layers))
    assert run_captured(capsys, "doctor", src, "--strict", "--target", "vllm==0.32.0")[0] == 1
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, err
    out, before = load_tensors(tmp_path / "out"), load_tensors(src)
    shards = [f"model.layers.0.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj")]
    assert all(out[f"{s}.weight"].dtype == torch.bfloat16 for s in shards)
    left = read_json(tmp_path / "out" / "config.json")["quantization_config"]["quantized_layers"]
    assert sorted(left) == sorted(n for n in layers if n not in shards)
    assert all(torch.equal(out[n], before[n]) for n in before if not any(n.startswith(s + ".") for s in shards) and n in out)
    code, text, _ = run_captured(capsys, "doctor", tmp_path / "out", "--strict", "--target", "vllm==0.32.0")
    assert code == 0, text


@pytest.mark.parametrize("name, value", [("model.layers.0.self_attn.q_proj.weight_scale", float("inf")),
                                         ("model.layers.0.mlp.down_proj.weight_scale_2", float("nan"))], ids=["fp8-inf", "nvfp4-nan"])
def test_a_target_fix_that_cannot_clear_doctor_refuses(capsys, tmp_path, name, value):
    """A kept FP8 / NVFP4 layer with a broken per-tensor scale: `fix --target vllm==0.32.0` cannot repair it without
    the original, wrote an output doctor --strict rejects for that target, and exited 0 ('1 finding(s) remain')."""
    tensors = tensors_for(healthy_layers())
    tensors[name] = torch.tensor(value)
    src = write_mixed(tmp_path / "src", tensors=tensors)
    err = refused(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert name in err and "doctor --strict" in err and "nothing was written" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*partial*"))


def test_the_writer_checks_what_it_wrote_against_doctor_too(capsys, tmp_path, monkeypatch):
    """With planning's refusal switched off, the writer's check of its own output (doctor after) still refuses the
    broken FP8 scale the output would keep: exit 2, nothing published."""
    import repair.planning.build as build

    monkeypatch.setattr(build, "refuse_unrepairable", lambda *a: None)
    tensors = tensors_for(healthy_layers())
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = torch.tensor(float("inf"))
    src = write_mixed(tmp_path / "src", tensors=tensors)
    err = refused(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert "[fp8-scale] model.layers.0.self_attn.q_proj.weight_scale is infinite" in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*partial*"))


def test_an_fp8_scale_whose_values_overflow_bf16_is_refused_at_plan_time(capsys, tmp_path):
    """weight_scale 1e37: finite and positive, but the float8 codes times it pass BF16's largest value. The writer's
    guard refused it after computing, while --dry-run accepted the plan."""
    tensors = tensors_for(healthy_layers())
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = torch.tensor(1e37)
    src = write_mixed(tmp_path / "src", tensors=tensors)
    err = refused(capsys, "fix", src, "-o", tmp_path / "out", "--target", "bf16", "--dry-run")
    assert "model.layers.0.self_attn.q_proj.weight_scale" in err and "BF16" in err


@pytest.mark.parametrize("args", [("--dry-run",), ("--tp", "2")], ids=["dry-run", "tp"])
def test_a_target_fix_that_cannot_clear_doctor_refuses_at_plan_time(capsys, tmp_path, args):
    """The same broken FP8 scale: --dry-run printed a plan and --tp 2 wrote per-rank output (no doctor after there)."""
    from tests.test_fix_mixed import LLAMA_TP_PLAN

    tensors = tensors_for(healthy_layers())
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = torch.tensor(float("inf"))
    src = write_mixed(tmp_path / "src", tensors=tensors)
    config = read_json(src / "config.json")
    (src / "config.json").write_text(json.dumps(dict(config, base_model_tp_plan=LLAMA_TP_PLAN)))
    err = refused(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", *args)
    assert "model.layers.0.self_attn.q_proj.weight_scale" in err and "doctor --strict" in err
    assert not (tmp_path / "out").exists()
