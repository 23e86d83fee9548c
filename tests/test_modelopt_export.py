"""Checks that tools.modelopt_export produces the real ModelOpt NVFP4 exports the rest of the suite treats as ground truth."""

from __future__ import annotations

import filecmp
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytest.importorskip("modelopt")
pytest.importorskip("transformers")

from tools import modelopt_export as me  # noqa: E402

PROJ = ("pre_projection", "post_projection")
FILES = ("config.json", "generation_config.json", "hf_quant_config.json", "model.safetensors")


@pytest.fixture(scope="session")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every export built once per session (each takes ~0.1 s once modelopt is imported)."""
    root = tmp_path_factory.mktemp("modelopt")
    return {
        "orig": me.save_original(root / "orig"),
        "bug": me.export_modelopt(root / "bug", exclude_projections=False),
        "bug_again": me.export_modelopt(root / "bug_again", exclude_projections=False),
        "fix": me.export_modelopt(root / "fix", exclude_projections=True),
        "nocal": me.export_modelopt(root / "nocal", exclude_projections=False, calibrate=False),
        "unified": me.export_modelopt(root / "unified", exclude_projections=False, unified=True),
        "ord_bug": me.export_modelopt(root / "ord_bug", exclude_projections=False, ordered_embeddings=True),
        "ord_fix": me.export_modelopt(root / "ord_fix", exclude_projections=True, ordered_embeddings=True),
        "llama": me.export_tiny_llama(root / "llama"),
        "llama_orig": me.save_tiny_llama_original(root / "llama_orig"),
    }


def tensors(d: Path) -> dict[str, torch.Tensor]:
    return load_file(d / "model.safetensors")


def exclusions(d: Path) -> tuple[list[str], list[str]]:
    """(config.json quantization_config.ignore, hf_quant_config.json exclude_modules)."""
    cfg = json.loads((d / "config.json").read_text())
    hf = json.loads((d / "hf_quant_config.json").read_text())
    return cfg["quantization_config"]["ignore"], hf["quantization"]["exclude_modules"]


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def packed_modules(sd: dict[str, torch.Tensor]) -> set[str]:
    return {k.removesuffix(".weight") for k, v in sd.items() if k.endswith(".weight") and v.dtype == torch.uint8}


def test_all_files_written(dirs: dict[str, Path]) -> None:
    for name in ("bug", "fix", "llama"):
        assert sorted(p.name for p in dirs[name].iterdir()) == sorted(FILES)


def test_broken_export_packs_projections(dirs: dict[str, Path]) -> None:
    sd = tensors(dirs["bug"])
    for mod, packed, scale in (("pre_projection", (64, 96), (64, 12)), ("post_projection", (96, 32), (96, 4))):
        assert sd[f"{mod}.weight"].dtype == torch.uint8 and tuple(sd[f"{mod}.weight"].shape) == packed
        assert sd[f"{mod}.weight_scale"].dtype == torch.float8_e4m3fn and tuple(sd[f"{mod}.weight_scale"].shape) == scale
        for s in ("weight_scale_2", "input_scale"):
            assert sd[f"{mod}.{s}"].dtype == torch.float32 and sd[f"{mod}.{s}"].shape == ()
    assert sd["pre_projection.weight_scale"].float().unique().numel() > 8  # the wide init spreads block scales
    assert exclusions(dirs["bug"]) == (["lm_head"], ["lm_head"])
    assert "lm_head.weight" not in sd  # tied to embed_tokens, not written


def test_correct_export_keeps_projections_bf16(dirs: dict[str, Path]) -> None:
    sd, orig = tensors(dirs["fix"]), tensors(dirs["orig"])
    assert sd["pre_projection.weight"].dtype == torch.bfloat16 and tuple(sd["pre_projection.weight"].shape) == (64, 192)
    assert sd["post_projection.weight"].dtype == torch.bfloat16 and tuple(sd["post_projection.weight"].shape) == (96, 64)
    assert [k for k in sd if k.startswith(PROJ)] == ["post_projection.weight", "pre_projection.weight"]
    for mod in PROJ:
        assert raw(sd[f"{mod}.weight"]) == raw(orig[f"{mod}.weight"])
    want = ["lm_head", "post_projection", "pre_projection"]
    assert exclusions(dirs["fix"]) == (want, want)


def test_other_tensors_identical_between_variants(dirs: dict[str, Path]) -> None:
    bug, fix = tensors(dirs["bug"]), tensors(dirs["fix"])
    rest = {k for k in bug if not k.startswith(PROJ)}
    assert rest == {k for k in fix if not k.startswith(PROJ)} and len(rest) == 54
    for k in sorted(rest):
        assert bug[k].dtype == fix[k].dtype and bug[k].shape == fix[k].shape, k
        assert raw(bug[k]) == raw(fix[k]), k
    assert packed_modules(bug) - packed_modules(fix) == set(PROJ)


def test_exports_are_deterministic(dirs: dict[str, Path]) -> None:
    for f in FILES:
        assert filecmp.cmp(dirs["bug"] / f, dirs["bug_again"] / f, shallow=False), f
    a, b = me.build_tiny_assistant(3), me.build_tiny_assistant(3)
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())
    c = me.build_tiny_assistant(4)
    assert not torch.equal(a.pre_projection.weight, c.pre_projection.weight)


def test_modelopt_quantize_reproduces_export(dirs: dict[str, Path]) -> None:
    sd, orig = tensors(dirs["bug"]), tensors(dirs["orig"])
    mods = packed_modules(sd)
    assert len(mods) == 12
    for m in sorted(mods):
        packed, scale, scale_2 = me.modelopt_quantize(orig[f"{m}.weight"], sd[f"{m}.weight_scale_2"])
        assert packed.dtype == torch.uint8 and raw(packed) == raw(sd[f"{m}.weight"]), m
        assert scale.dtype == torch.float8_e4m3fn and raw(scale) == raw(sd[f"{m}.weight_scale"]), m
        assert scale_2.shape == () and raw(scale_2) == raw(sd[f"{m}.weight_scale_2"]), m
    # gate/up share one global scale (fused siblings); q_proj and o_proj do not
    assert torch.equal(sd["model.layers.0.mlp.gate_proj.weight_scale_2"], sd["model.layers.0.mlp.up_proj.weight_scale_2"])
    assert not torch.equal(sd["model.layers.0.self_attn.q_proj.weight_scale_2"], sd["model.layers.0.self_attn.o_proj.weight_scale_2"])
    # without an explicit scale_2 the quantizer derives amax / (6 * 448) itself
    w = orig["pre_projection.weight"]
    assert me.modelopt_quantize(w)[2].item() == pytest.approx(w.float().abs().max().item() / 2688, rel=1e-6)


def test_modelopt_dequantize_matches_format(dirs: dict[str, Path]) -> None:
    sd, orig = tensors(dirs["bug"]), tensors(dirs["orig"])
    packed, s, s2 = sd["pre_projection.weight"], sd["pre_projection.weight_scale"], sd["pre_projection.weight_scale_2"]
    out = me.modelopt_dequantize(packed, s, s2)
    assert out.dtype == torch.bfloat16 and tuple(out.shape) == (64, 192)
    e2m1 = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, 0, -.5, -1, -1.5, -2, -3, -4, -6])
    codes = torch.stack([packed & 0xF, packed >> 4], -1).reshape(64, 192).long()  # low nibble = even column
    ref = e2m1[codes] * (s.float() * s2).repeat_interleave(16, dim=1)
    assert torch.equal(out, ref.to(torch.bfloat16))
    rel = (out.float() - orig["pre_projection.weight"].float()).norm() / orig["pre_projection.weight"].float().norm()
    assert 0.02 < rel < 0.15
    assert me.modelopt_dequantize(packed, s, s2, dtype=torch.float32).dtype == torch.float32


def test_original_is_plain_bf16(dirs: dict[str, Path]) -> None:
    orig = tensors(dirs["orig"])
    assert len(orig) == 26 and {v.dtype for v in orig.values()} == {torch.bfloat16} and "lm_head.weight" not in orig
    cfg = json.loads((dirs["orig"] / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4AssistantForCausalLM"] and "quantization_config" not in cfg
    assert cfg["dtype"] == "bfloat16" and cfg["backbone_hidden_size"] == 96
    bug_cfg = json.loads((dirs["bug"] / "config.json").read_text())
    assert {k for k in bug_cfg if bug_cfg[k] != cfg.get(k)} == {"quantization_config"}
    assert tuple(orig["model.layers.1.self_attn.q_proj.weight"].shape) == (128, 64)  # global_head_dim 64
    assert tuple(orig["model.layers.0.self_attn.q_proj.weight"].shape) == (64, 64)


def test_calibration_writes_input_scales(dirs: dict[str, Path]) -> None:
    with_cal, without = tensors(dirs["bug"]), tensors(dirs["nocal"])
    assert sum(k.endswith(".input_scale") for k in with_cal) == 12
    assert not any(k.endswith(".input_scale") for k in without)
    hf = json.loads((dirs["nocal"] / "hf_quant_config.json").read_text())
    assert hf["quantization"]["quant_algo"] == "NVFP4"  # still claims W4A4
    for k, v in without.items():  # weights do not depend on activation calibration
        assert raw(v) == raw(with_cal[k]), k


def test_unified_assistant(dirs: dict[str, Path]) -> None:
    sd = tensors(dirs["unified"])
    cfg = json.loads((dirs["unified"] / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma4UnifiedAssistantForCausalLM"]
    assert set(PROJ) <= packed_modules(sd) and exclusions(dirs["unified"]) == (["lm_head"], ["lm_head"])


def test_ordered_embeddings_centroids_share_scale_with_post_projection(dirs: dict[str, Path]) -> None:
    """centroids reads the same hidden state as post_projection, so ModelOpt gives them one weight_scale_2."""
    bug, fix = tensors(dirs["ord_bug"]), tensors(dirs["ord_fix"])
    c = "masked_embedding.centroids"
    assert bug["masked_embedding.token_ordering"].dtype == torch.int64
    assert tuple(bug[f"{c}.weight"].shape) == (8, 32) and tuple(bug[f"{c}.weight_scale"].shape) == (8, 4)
    assert torch.equal(bug[f"{c}.weight_scale_2"], bug["post_projection.weight_scale_2"])
    assert not torch.equal(fix[f"{c}.weight_scale_2"], bug[f"{c}.weight_scale_2"])
    differ = {k for k in bug if not k.startswith(PROJ) and raw(bug[k]) != raw(fix[k])}
    assert differ == {f"{c}.weight", f"{c}.weight_scale", f"{c}.weight_scale_2"}


def test_tiny_llama_export(dirs: dict[str, Path]) -> None:
    sd, orig = tensors(dirs["llama"]), tensors(dirs["llama_orig"])
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    assert packed_modules(sd) == {f"model.layers.{i}.{n}" for i in range(2) for n in names}
    for m in packed_modules(sd):
        assert sd[f"{m}.weight_scale"].dtype == torch.float8_e4m3fn and sd[f"{m}.input_scale"].shape == ()
        assert raw(me.modelopt_quantize(orig[f"{m}.weight"], sd[f"{m}.weight_scale_2"])[0]) == raw(sd[f"{m}.weight"])
    assert tuple(sd["model.layers.0.self_attn.k_proj.weight"].shape) == (32, 32)
    assert sd["lm_head.weight"].dtype == torch.bfloat16 and raw(sd["lm_head.weight"]) == raw(orig["lm_head.weight"])
    qkv = [sd[f"model.layers.0.self_attn.{p}_proj.weight_scale_2"] for p in "qkv"]
    assert torch.equal(qkv[0], qkv[1]) and torch.equal(qkv[0], qkv[2])
    want = ["lm_head", "model.embed_tokens"]
    assert exclusions(dirs["llama"]) == (want, want)
