"""Values, not their proxies (issue 25.9, first half): every scale check tests the value the dequantizer multiplies
by, after rounding, and doctor, `--dry-run` and the real run agree.

Checkpoint: tests/mixed_helpers.py's ModelOpt MIXED_PRECISION Llama (FP8 attention, NVFP4 / W4A16 / NVFP4_AWQ MLPs,
FP8 KV cache), one scale replaced per case. ModelOpt's FP8QTensor.dequantize rounds the scale to the output dtype
first (codec/fp8_table.py); NVFP4 multiplies block scale x weight_scale_2 in float32 (codec/dequant_table.py).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from repair.codec import float_bits, fp8_table
from tests.conftest import load_tensors, run_captured
from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed

FP8 = "model.layers.0.self_attn.o_proj"
NVFP4 = "model.layers.0.mlp.down_proj"
AWQ = "model.layers.1.mlp.down_proj"
K_SCALE = "model.layers.0.self_attn.k_proj.k_scale"
BF16_MAX = 3.3895313892515355e38


def _under_the_bound() -> float:
    """The largest float32 scale with 448 x scale <= BF16's largest finite value, whose BF16 rounding passes it."""
    s = np.float32(BF16_MAX / 448)
    while float(s) * 448 > BF16_MAX:
        s = np.nextafter(s, np.float32(0))
    return float(s)


def checkpoint(tmp_path, name: str, value) -> object:
    tensors = tensors_for(healthy_layers())
    tensors[name] = value if isinstance(value, torch.Tensor) else torch.tensor(value, dtype=torch.float32)
    return write_mixed(tmp_path / "src", tensors=tensors)


def fix(capsys, src, out, *args) -> tuple[int, str]:
    code, text, err = run_captured(capsys, "fix", src, "-o", out, *args)
    assert code in (0, 2) and "Traceback" not in err, (code, err)
    if code == 2:
        assert text == "" and err.count("\n") == 1 and not out.exists(), err
    return code, err


def doctor_codes(capsys, src, target: str) -> set[tuple[str, str]]:
    code, out, err = run_captured(capsys, "doctor", src, "--target", target, "--strict", "--json")
    assert code in (0, 1), err
    return {(f["code"], f["subject"]) for f in json.loads(out)["findings"]}


def test_a_fp8_scale_that_rounds_to_zero_in_bf16_is_refused_not_written_as_zeros(capsys, tmp_path):
    """1e-45 passed the "> 0" check; BF16(1e-45) is 0, so o_proj was written as all zeros with exit 0."""
    assert fp8_table.byte_table(1e-45, "BF16")[0x38] == 0  # the dequantizer's own factor: 1.0 x BF16(1e-45)
    src = checkpoint(tmp_path, f"{FP8}.weight_scale", 1e-45)
    assert ("fp8-scale", f"{FP8}.weight_scale") in doctor_codes(capsys, src, "bf16")
    for args in (("--target", "bf16", "--dry-run"), ("--target", "bf16")):
        code, err = fix(capsys, src, tmp_path / "out", *args)
        assert code == 2 and f"{FP8}.weight_scale" in err and "rounds to 0" in err, err


def test_a_fp8_scale_just_under_the_bf16_bound_is_judged_alike_by_dry_run_and_the_real_run(capsys, tmp_path):
    """448 x scale fits BF16 in float32, but the BF16-rounded scale times 448 does not: --dry-run accepted it and
    the real run refused it."""
    scale = _under_the_bound()
    rounded = float_bits.to_float32(float_bits.from_float32(np.array([scale], dtype=np.float32), "BF16"), "BF16")[0]
    assert scale * 448 <= BF16_MAX < float(rounded) * 448
    src = checkpoint(tmp_path, f"{FP8}.weight_scale", scale)
    dry = fix(capsys, src, tmp_path / "out", "--target", "bf16", "--dry-run")
    real = fix(capsys, src, tmp_path / "out", "--target", "bf16")
    assert dry[0] == real[0] == 2, (dry, real)
    assert f"{FP8}.weight_scale" in dry[1] and "past BF16" in dry[1]
    assert ("fp8-scale", f"{FP8}.weight_scale") in doctor_codes(capsys, src, "bf16")


def test_a_global_scale_whose_products_round_to_zero_is_refused(capsys, tmp_path):
    """weight_scale_2 = 1e-45 is "> 0", but block scale x it x 6 rounds to 0 in BF16: every block dequantized to 0."""
    src = checkpoint(tmp_path, f"{NVFP4}.weight_scale_2", 1e-45)
    assert ("global-scale", f"{NVFP4}.weight_scale_2") in doctor_codes(capsys, src, "bf16")
    for args in (("--target", "bf16", "--dry-run"), ("--target", "bf16")):
        code, err = fix(capsys, src, tmp_path / "out", *args)
        assert code == 2 and f"{NVFP4}.weight_scale_2" in err and "rounds to 0" in err, err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e-45], ids=["nan", "inf", "erases"])
def test_a_pre_quant_scale_is_judged_at_plan_time_by_its_folded_value(capsys, tmp_path, value):
    """NaN / inf columns were left to the writer (--dry-run accepted them); a tiny positive one folded the input
    channel to zeros, silently."""
    scale = tensors_for(healthy_layers())[f"{AWQ}.pre_quant_scale"].float().clone()
    scale[3] = value
    src = checkpoint(tmp_path, f"{AWQ}.pre_quant_scale", scale)
    for args in (("--target", "bf16", "--dry-run"), ("--target", "bf16")):
        code, err = fix(capsys, src, tmp_path / "out", *args)
        assert code == 2 and f"{AWQ}.pre_quant_scale" in err and "column 3" in err, err


def test_a_subnormal_kv_scale_is_an_error(capsys, tmp_path):
    """The runtime divides every cached key by k_scale; 1e-45 passed "> 0" and 1.0 / it is infinite in float32."""
    src = checkpoint(tmp_path, K_SCALE, 1e-45)
    assert ("kv-cache-scales", K_SCALE) in doctor_codes(capsys, src, "vllm==0.32.0")


def test_healthy_scales_still_pass_and_dequantize(capsys, tmp_path):
    src = write_mixed(tmp_path / "src")
    code, err = fix(capsys, src, tmp_path / "out", "--target", "bf16", "--quiet")
    assert code == 0, err
    assert all(t.dtype != torch.uint8 for t in load_tensors(tmp_path / "out").values())


def test_a_healthy_layer_whose_smallest_blocks_are_below_f16s_range_is_not_refused(capsys, tmp_path):
    """F16's smallest value is 6e-8: a near-zero block (block scale code 0x01) of a layer with a small but real
    weight_scale_2 dequantizes to 0 in F16, as it would for ModelOpt. That is F16's range, not a broken scale: only a
    scale that zeroes the whole layer, or whose float32 product with a block scale is 0, is refused."""
    tensors = tensors_for(healthy_layers())
    tensors[f"{NVFP4}.weight_scale_2"] = torch.tensor(2e-6)
    blocks = tensors[f"{NVFP4}.weight_scale"].view(torch.uint8).clone()
    blocks[0, 0] = 0x01
    tensors[f"{NVFP4}.weight_scale"] = blocks.view(torch.float8_e4m3fn)
    src = write_mixed(tmp_path / "src", tensors=tensors)
    recipe = tmp_path / "f16.toml"
    recipe.write_text(f'dtype = "f16"\n[[rules]]\naction = "dequantize"\nmodules = ["{NVFP4}"]\n')
    code, err = fix(capsys, src, tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, err
    assert ("global-scale", f"{NVFP4}.weight_scale_2") not in doctor_codes(capsys, src, "bf16")


NAN_PAYLOAD = np.array([0x7FC01234], dtype=np.uint32).view(np.float32)[0]
F16_MAX = 65504.0
BOUNDARY = {"f16-zero": 1e-8, "f16-subnormal": 6e-8, "f16-edge": F16_MAX / 448, "f16-over": F16_MAX / 448 * 1.01,
            "bf16-under": _under_the_bound(), "f32-max": float(np.finfo(np.float32).max), "f32-tiny": float(np.finfo(np.float32).tiny),
            "neg-zero": -0.0, "nan-payload": float(NAN_PAYLOAD), "neg-inf": float("-inf")}


GLOBAL = {"f32-zero": 1e-45, "f16-zero": 1e-12, "f16-over": 1e3, "bf16-over": 1e36, "f32-max": float(np.finfo(np.float32).max),
          "neg-zero": -0.0, "nan-payload": float(NAN_PAYLOAD)}
CASES = [(FP8, "weight_scale", key, value) for key, value in BOUNDARY.items()] + \
        [(NVFP4, "weight_scale_2", key, value) for key, value in GLOBAL.items()]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("module,leaf,key,value", CASES, ids=[f"{c[1]}-{c[2]}" for c in CASES])
def test_dry_run_and_the_real_run_agree_on_every_boundary_scale(capsys, tmp_path, module, leaf, key, value, dtype):
    """--dry-run accepts exactly what the real run writes, in the recipe's output dtype; what is written holds
    neither infinities nor a layer zeroed by its scale (FP8 weight_scale, NVFP4 weight_scale_2)."""
    src = checkpoint(tmp_path, f"{module}.{leaf}", value)
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'dtype = "{dtype}"\n[[rules]]\naction = "dequantize"\nmodules = ["{module}"]\n')
    dry = fix(capsys, src, tmp_path / "dry", "--recipe", recipe, "--dry-run", "--quiet")
    real = fix(capsys, src, tmp_path / "out", "--recipe", recipe, "--quiet")
    assert dry[0] == real[0], (dry, real)
    if real[0] == 0:
        weight = load_tensors(tmp_path / "out")[f"{module}.weight"].float()
        assert torch.isfinite(weight).all() and weight.abs().max() > 0
