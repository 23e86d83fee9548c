"""ModelOpt MIXED_PRECISION `quantized_layers` keys as vLLM reads them: each release's ModelOptMixedPrecisionConfig maps
them with the built class's hf_to_vllm_mapper (WeightsMapper.apply_dict, modelopt.py:1888 in 0.32, 1814 in 0.30, 2430
in 0.28; the profile's `modelopt_mixed_keys`, tools/vllm_mixed_keys.py) before any layer asks, so a layer resolves from
keys in vLLM's spelling, asked under vLLM's name (repair/targets/entry_mappers.py). vLLM's own rewrite and loader judge
the same in the tier (tests/vllm/test_mixed_keys_vs_vllm.py)."""

from __future__ import annotations

import json

import pytest

from repair import arch
from repair.formats.algorithms import LayerAlgorithms
from repair.targets.entry_mappers import NameMapper, mapped_layers
from tests.conftest import run_captured
from tests.test_entry_mappers import gpt_oss_o_proj_bf16
from tests.test_fix_runtime_prefixes import export
from tools.vllm_mixed_keys import MAPPED, PROBE

TARGETS = ("vllm==0.28.0", "vllm==0.30.0", "vllm==0.32.0")
NVFP4, FP8 = {"quant_algo": "NVFP4", "group_size": 16}, {"quant_algo": "FP8"}


def gpt_oss_mixed(root, layers: dict, bf16_o_proj: bool = False):
    """A GptOss export (o_proj NVFP4 in both layers) declared MIXED_PRECISION in config.json with `layers` as its map
    (GptOss's mapper renames `.self_attn.` to `.attn.`, gpt_oss.py hf_to_vllm_mapper)."""
    folder = gpt_oss_o_proj_bf16(root, []) if bf16_o_proj else export(root, "GptOssForCausalLM", "gpt_oss", {}, ["lm_head"])
    (folder / "hf_quant_config.json").unlink()
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION", "ignore": ["lm_head"],
                                     "quantized_layers": layers}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_every_profiled_release_maps_the_keys_with_apply_dict():
    for profile in arch.PROFILES:
        if profile.runtime == "vllm":
            assert profile.modelopt_mixed_keys.get("mapped") == "apply_dict", profile.label


def test_keys_are_mapped_as_apply_dict_maps_them():
    """The generator's probe (a prefix rename folding `c.` into `b.`, a dropped `drop.`, a key ending `*`): every key is
    mapped as a weight name, a dropped one is gone, two alike are one key at the first one's place with the last one's
    value, and no `X*` split (that is the exclusion list's)."""
    probe = NameMapper.read({"prefix": [["drop.", None], ["c.", "b."]]})
    algos = LayerAlgorithms(tuple((k, v["quant_algo"]) for k, v in PROBE.items()))
    assert mapped_layers(algos, (probe,)).entries == tuple((k, v["quant_algo"]) for k, v in MAPPED.items())
    assert mapped_layers(algos, ()).entries == algos.entries


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("spelling", ["self_attn", "attn"])
def test_keys_in_either_spelling_declare_the_layer_vllm_builds(capsys, tmp_path, target, spelling):
    """vLLM maps `model.layers.N.self_attn.o_proj` to `model.layers.N.attn.o_proj` and leaves vLLM's own spelling as it
    is, then asks `model.layers.N.attn.o_proj`: both maps declare the stored NVFP4 layers (doctor said BF16 for vLLM's)."""
    folder = gpt_oss_mixed(tmp_path / "x", {f"model.layers.{n}.{spelling}.o_proj": NVFP4 for n in range(2)})
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target)
    assert code == 0, out + err


@pytest.mark.parametrize("target", TARGETS)
def test_two_keys_vllm_maps_alike_are_one_with_the_last_ones_algorithm(capsys, tmp_path, target):
    """apply_dict keeps the last value of keys it maps to one name: `self_attn.o_proj` FP8 then `attn.o_proj` NVFP4 is
    NVFP4 in vLLM (doctor read the first key, FP8, and called the stored NVFP4 layer a mismatch); the other order FP8."""
    last_nvfp4 = {"model.layers.0.self_attn.o_proj": FP8, "model.layers.0.attn.o_proj": NVFP4, "model.layers.1.attn.o_proj": NVFP4}
    assert run_captured(capsys, "doctor", gpt_oss_mixed(tmp_path / "a", last_nvfp4), "--target", target)[0] == 0
    last_fp8 = {"model.layers.0.attn.o_proj": NVFP4, "model.layers.0.self_attn.o_proj": FP8, "model.layers.1.attn.o_proj": NVFP4}
    code, out, _ = run_captured(capsys, "doctor", gpt_oss_mixed(tmp_path / "b", last_fp8), "--target", target)
    assert code == 1 and "model.layers.0.self_attn.o_proj" in out and "FP8" in out, out


def test_a_release_recording_no_rewrite_reads_the_keys_as_written(tmp_path):
    """Where a release's data records no rewrite (`modelopt_mixed_keys` {}), the keys are read as written."""
    from dataclasses import replace

    from repair.doctor import diagnose  # noqa: F401 - the doctor stack, as the CLI imports it
    from repair.formats import detect
    from repair.io.checkpoint import open_checkpoint
    from repair.targets.profiles import resolve

    folder = gpt_oss_mixed(tmp_path / "x", {f"model.layers.{n}.attn.o_proj": NVFP4 for n in range(2)})
    ckpt = open_checkpoint(folder)
    declaration = detect(ckpt).read_declaration(ckpt)
    target = resolve("vllm==0.32.0")
    family = target.release.row("GptOssForCausalLM")
    bound = target.bind(declaration, family, ckpt.config)
    assert bound.algorithm("model.layers.0.self_attn.o_proj") == "NVFP4"
    plain = replace(target, release=replace(target.release, modelopt_mixed_keys={}))
    assert plain.bind(declaration, family, ckpt.config).algorithm("model.layers.0.self_attn.o_proj") is None


@pytest.mark.parametrize("spelling", ["self_attn", "attn"])
def test_fix_target_turns_a_bf16_layer_out_of_the_map_in_either_spelling(capsys, tmp_path, spelling):
    """Layer 0's o_proj stored BF16 but declared NVFP4 by a key in either spelling: fix --target takes the key vLLM
    reads it by out of the map, and doctor --strict passes the output (fix's promise)."""
    src = gpt_oss_mixed(tmp_path / "src", {f"model.layers.{n}.{spelling}.o_proj": NVFP4 for n in range(2)}, bf16_o_proj=True)
    assert run_captured(capsys, "doctor", src, "--target", "vllm==0.32.0")[0] == 1
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert code == 0, out + err
    assert run_captured(capsys, "doctor", tmp_path / "out", "--target", "vllm==0.32.0", "--strict")[0] == 0
    layers = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["quantized_layers"]
    assert list(layers) == [f"model.layers.1.{spelling}.o_proj"], layers


@pytest.mark.parametrize("spelling", ["self_attn", "attn"])
def test_requantizing_a_layer_declared_fp8_in_vllms_spelling_keeps_it_fp8(capsys, tmp_path, spelling):
    """Layer 0's o_proj stored FP8 (ModelOpt's FP8 export of the original's weight) and keyed FP8 in either spelling:
    vLLM reads both as FP8 (doctor exits 0), so --requantize from --original keeps it FP8 and declared as it was (fix
    refused vLLM's spelling: "quantized_layers does not declare it", asking the keys unmapped)."""
    import torch  # noqa: F401 - safetensors.torch's
    from safetensors.torch import load_file, save_file

    from tools.modelopt_oracles import fp8_export

    layers = {f"model.layers.0.{spelling}.o_proj": FP8, f"model.layers.1.{spelling}.o_proj": NVFP4}
    src, name = gpt_oss_mixed(tmp_path / "src", layers), "model.layers.0.self_attn.o_proj"
    assert run_captured(capsys, "fix", src, "-o", tmp_path / "orig", "--target", "bf16", "--quiet")[0] == 0
    tensors = {k: v for k, v in load_file(src / "model.safetensors").items() if not k.startswith(name + ".")}
    tensors.update({f"{name}.{leaf}": v for leaf, v in fp8_export(load_file(tmp_path / "orig" / "model.safetensors")
                                                                     [f"{name}.weight"]).items()})
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    assert run_captured(capsys, "doctor", src, "--target", "vllm==0.32.0")[0] == 0
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--original", tmp_path / "orig",
                                  "--requantize", name, "--target", "vllm==0.32.0")
    assert code == 0, out + err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["quantized_layers"] == layers
    assert run_captured(capsys, "doctor", tmp_path / "out", "--target", "vllm==0.32.0", "--strict")[0] == 0


def test_requantizing_a_layer_keyed_in_vllms_spelling_adds_no_second_key(capsys, tmp_path):
    """An NVFP4 layer keyed in vLLM's spelling, requantized from --original: the map stays as written (fix added a
    second key in the checkpoint's spelling, `model.layers.0.self_attn.o_proj`, reading the layer as undeclared)."""
    layers = {f"model.layers.{n}.attn.o_proj": NVFP4 for n in range(2)}
    src = gpt_oss_mixed(tmp_path / "src", layers)
    assert run_captured(capsys, "fix", src, "-o", tmp_path / "orig", "--target", "bf16", "--quiet")[0] == 0
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--original", tmp_path / "orig",
                                  "--requantize", "model.layers.0.self_attn.o_proj", "--target", "vllm==0.32.0")
    assert code == 0, out + err
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["quantized_layers"] == layers


def with_bf16_qkv(folder):
    """`folder` with BF16 q/k/v_proj weights stored in both layers (vLLM fuses them into `attn.qkv_proj`)."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    tensors.update({f"model.layers.{n}.self_attn.{p}.weight": torch.zeros(32, 32, dtype=torch.bfloat16)
                    for n in range(2) for p in ("q_proj", "k_proj", "v_proj")})
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("key", ["model.layers.0.attn.qkv_proj", "model.layers.0.self_attn.qkv_proj"])
def test_a_key_naming_the_fused_layer_vllm_builds_declares_its_shards(capsys, tmp_path, key):
    """A key naming the layer vLLM builds from q/k/v_proj (`attn.qkv_proj`, a name no checkpoint module has): vLLM
    0.32 asks `model.layers.0.attn.qkv_proj` and finds it directly (modelopt.py _resolve_quant_algo step 1, after
    is_layer_excluded), so it builds the layer NVFP4 and cannot load the stored BF16 q/k/v weights. Doctor asked each
    shard alone, found no key and called them excluded (exit 0)."""
    layers = {key: NVFP4, **{f"model.layers.{n}.attn.o_proj": NVFP4 for n in range(2)}}
    src = with_bf16_qkv(gpt_oss_mixed(tmp_path / "src", layers))
    code, out, _ = run_captured(capsys, "doctor", src, "--target", "vllm==0.32.0")
    assert code == 1 and "model.layers.0.self_attn.q_proj: stored bf16" in out, out
    assert "model.layers.1.self_attn.q_proj" not in out, out
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    assert code == 0, out + err
    assert run_captured(capsys, "doctor", tmp_path / "out", "--target", "vllm==0.32.0", "--strict")[0] == 0
    assert key not in json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["quantized_layers"]


def test_shards_keyed_in_vllms_spelling_that_disagree_are_named_with_their_algorithms(capsys, tmp_path):
    """q/k/v_proj keyed in vLLM's spelling with NVFP4, FP8, NVFP4: vLLM refuses the fused layer (shards that
    disagree), and doctor's line says each shard's algorithm as vLLM reads it (it said `-`, reading the keys unmapped)."""
    algos = {"q_proj": NVFP4, "k_proj": FP8, "v_proj": NVFP4}
    layers = {**{f"model.layers.0.attn.{p}": a for p, a in algos.items()}, **{f"model.layers.{n}.attn.o_proj": NVFP4 for n in range(2)}}
    code, out, _ = run_captured(capsys, "doctor", with_bf16_qkv(gpt_oss_mixed(tmp_path / "src", layers)), "--target", "vllm==0.32.0")
    assert code == 1 and "(q_proj NVFP4, k_proj FP8, v_proj NVFP4)" in out, out


def test_many_keys_under_a_bf16_layer_in_both_spellings_leave_in_linear_time(capsys, tmp_path):
    """50,000 keys under layer 0's o_proj, half in each spelling, the layer stored BF16: fix takes every one out (vLLM
    reads them all as under `model.layers.0.attn.o_proj`). Each key was tested against every name taken out, the
    keys vLLM reads included (quadratic: 10^5 keys took 4.5 minutes); now a set of names and each key's dotted prefixes."""
    import time

    layers = {f"model.layers.0.{s}.o_proj.x{j}": NVFP4 for j in range(25_000) for s in ("self_attn", "attn")}
    src = gpt_oss_mixed(tmp_path / "src", {**layers, "model.layers.1.attn.o_proj": NVFP4}, bf16_o_proj=True)
    config = json.loads((src / "config.json").read_text())  # ModelOpt's config_groups name the same layers
    config["quantization_config"]["config_groups"] = {"group_0": {"targets": [*layers, "model.layers.1.attn.o_proj"]}}
    (src / "config.json").write_text(json.dumps(config))
    start = time.monotonic()
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, out + err
    assert time.monotonic() - start < 20, time.monotonic() - start
    kept = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["quantized_layers"]
    assert list(kept) == ["model.layers.1.attn.o_proj"]
