"""The default fix on ModelOpt's real buggy export of a tiny Gemma 4 assistant."""

from __future__ import annotations

import torch

from repair.cli import main
from repair.arch.gemma4_assistant import draft_prefix
from repair.formats.modelopt_nvfp4 import is_excluded
from tests.conftest import load_tensors, raw_bytes, read_json, tree_hashes
from tools.modelopt_export import modelopt_dequantize

HANDSHAKE = ("pre_projection", "post_projection")


def run_fix(src, out, *extra):
    try:
        main(["fix", str(src), "-o", str(out), "--quiet", *extra])
    except SystemExit as exc:
        return exc.code
    return 0


def test_fix_dequantizes_handshake_layers_bitwise_like_modelopt(broken_export, tmp_path):
    before = tree_hashes(broken_export)
    out = tmp_path / "fixed"
    assert run_fix(broken_export, out) == 0
    assert tree_hashes(broken_export) == before, "the input was modified"
    src, got = load_tensors(broken_export), load_tensors(out)
    for name, shape in (("pre_projection", [64, 192]), ("post_projection", [96, 64])):
        weight = got[f"{name}.weight"]
        assert weight.dtype == torch.bfloat16 and list(weight.shape) == shape
        expected = modelopt_dequantize(src[f"{name}.weight"], src[f"{name}.weight_scale"], src[f"{name}.weight_scale_2"])
        assert torch.equal(weight.view(torch.int16), expected.view(torch.int16))
        assert not [k for k in got if k.startswith(f"{name}.") and k != f"{name}.weight"], "scale tensors left behind"


def test_fix_keeps_every_other_tensor_byte_identical(broken_export, tmp_path):
    out = tmp_path / "fixed"
    assert run_fix(broken_export, out) == 0
    src, got = load_tensors(broken_export), load_tensors(out)
    untouched = [k for k in src if not k.startswith(HANDSHAKE)]
    assert len(untouched) > 30
    for name in untouched:
        assert got[name].dtype == src[name].dtype and raw_bytes(got[name]) == raw_bytes(src[name]), name


def test_fix_output_matches_the_correct_export_tensor_set_and_shapes(broken_export, correct_export, tmp_path):
    out = tmp_path / "fixed"
    assert run_fix(broken_export, out) == 0
    got, want = load_tensors(out), load_tensors(correct_export)
    assert {k: (v.dtype, tuple(v.shape)) for k, v in got.items()} == {k: (v.dtype, tuple(v.shape)) for k, v in want.items()}


def test_fix_exclusions_cover_handshake_in_both_files_under_vllm_rules(broken_export, correct_export, tmp_path):
    out = tmp_path / "fixed"
    assert run_fix(broken_export, out) == 0
    config, hf_quant = read_json(out / "config.json"), read_json(out / "hf_quant_config.json")
    ignore, exclude = config["quantization_config"]["ignore"], hf_quant["quantization"]["exclude_modules"]
    assert ignore == exclude
    for module in HANDSHAKE:
        assert is_excluded(draft_prefix(module), ignore) and is_excluded(draft_prefix(module), exclude)
    packed = {k.removesuffix(".weight_scale") for k in load_tensors(out) if k.endswith(".weight_scale")}
    assert packed and not [m for m in packed if is_excluded(draft_prefix(m), ignore)], "a quantized module became excluded"
    correct = read_json(correct_export / "config.json")["quantization_config"]["ignore"]
    assert sorted(ignore) == sorted(correct)
    source = read_json(broken_export / "config.json")
    source["quantization_config"]["ignore"] = ignore
    assert config == source, "config.json changed beyond the exclusions"


def test_fix_copies_the_other_files_unchanged(broken_export, tmp_path):
    out = tmp_path / "fixed"
    assert run_fix(broken_export, out) == 0
    src, got = tree_hashes(broken_export), tree_hashes(out)
    assert got["generation_config.json"] == src["generation_config.json"]
    assert set(got) == set(src) | {"repair_report.json"}
