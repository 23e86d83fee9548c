"""A layer the class builds as one parameter without a packed_modules_mapping naming it (the row's `merged_layers`:
vLLM 0.32's StableLM stacks q/k/v_proj into qkv_proj by its loader's renames; the Gemma 4 assistant's gate/up) with
one shard stored BF16 beside NVFP4 ones: vLLM builds the layer NVFP4 and stops on the BF16 shard's shape
(tests/vllm/test_merged_shards_vs_vllm.py: load_qkv_weight's assertion). doctor said nothing of StableLM's (its fused
check read `fused_groups` only), and fix --target excluded k_proj alone, an entry vLLM never asks about the merged
qkv_proj (it asks the layer's own name), so its output failed the same way; for the assistant it stopped on its own
check (exit 3). Now doctor reports the layer, and fix dequantizes every shard and names the merged layer."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from repair.codec import nvfp4
from tests.conftest import read_json, run_captured
from tests.test_fix_runtime_prefixes import export

TARGET = "vllm==0.32.0"
ATTN = "model.layers.0.self_attn"


def stablelm_k_bf16(root: Path) -> Path:
    """Two layers of q/k/v packed NVFP4 with one global scale per layer, but layer 0's k_proj stored BF16."""
    gen = torch.Generator().manual_seed(1)
    extra = {}
    for layer in range(2):
        weights = {leaf: (torch.randn(32, 32, generator=gen) * 0.05).to(torch.bfloat16) for leaf in ("q_proj", "k_proj", "v_proj")}
        shared = nvfp4.global_scale(torch.cat(list(weights.values())))
        for leaf, weight in weights.items():
            name = f"model.layers.{layer}.self_attn.{leaf}"
            if layer == 0 and leaf == "k_proj":
                extra[f"{name}.weight"] = weight
                continue
            codes, scale, scale_2 = nvfp4.quantize(weight, shared.clone())
            extra.update({f"{name}.weight": codes, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
                          f"{name}.input_scale": torch.tensor(0.01)})
    return export(root, "StableLmForCausalLM", "stablelm", extra, ["lm_head"])


def findings(capsys, src: Path, *args: str) -> list[dict]:
    code, text, err = run_captured(capsys, "doctor", src, "--target", TARGET, "--json", *args)
    return json.loads(text)["findings"]


def test_doctor_reports_the_merged_layer_whose_shards_are_stored_apart(capsys, tmp_path):
    found = [f for f in findings(capsys, stablelm_k_bf16(tmp_path / "src")) if f["code"] == "fused-shards"]
    assert [f["subject"] for f in found] == [f"{ATTN}.qkv_proj"], found
    assert found[0]["severity"] == "error" and "load_qkv_weight" in found[0]["runtime_error"]


def test_a_shard_stored_apart_gets_one_error_with_the_repair_that_loads(capsys, tmp_path):
    """The fused-shards error is the whole account of a shard stored apart from its siblings: the per-shard
    "exclude it" advice beside it was wrong for both kinds of layer. vLLM 0.32 refuses a fused layer whose shards are
    excluded apart ("Detected some but not all shards of ... are quantized", quant_utils.is_layer_skipped), and a
    merged layer excluded by its own name alone builds BF16 parameters the NVFP4 shards do not fit."""
    merged = findings(capsys, stablelm_k_bf16(tmp_path / "stablelm"))
    fused = findings(capsys, export(tmp_path / "llama", "LlamaForCausalLM", "llama", _qkv_with_k_bf16(), ["lm_head"]))
    for found in (merged, fused):
        errors = [(f["code"], f["subject"]) for f in found if f["severity"] == "error"]
        assert errors == [("fused-shards", f"{ATTN}.qkv_proj")], found


def _qkv_with_k_bf16() -> dict[str, torch.Tensor]:
    """stablelm_k_bf16's tensors: q/k/v of two layers packed with one shared scale, layer 0's k_proj BF16."""
    from safetensors.torch import load_file
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        tensors = load_file(stablelm_k_bf16(Path(tmp) / "x") / "model.safetensors")
    return {k: v for k, v in tensors.items() if ".self_attn." in k and ".o_proj." not in k}


def test_fix_dequantizes_every_shard_and_names_the_merged_layer(capsys, tmp_path):
    src = stablelm_k_bf16(tmp_path / "src")
    out = tmp_path / "out"
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET)
    assert code == 0, (text, err)
    entries = read_json(out / "hf_quant_config.json")["quantization"]["exclude_modules"]
    assert f"{ATTN}.qkv_proj" in entries, entries  # the name vLLM asks its config about (modelopt.py is_layer_excluded)
    from safetensors.torch import load_file

    written = load_file(out / "model.safetensors")
    assert all(written[f"{ATTN}.{leaf}.weight"].dtype == torch.bfloat16 for leaf in ("q_proj", "k_proj", "v_proj"))
    assert not [f for f in findings(capsys, out, "--strict") if f["severity"] in ("error", "warning")]


def test_fix_of_the_assistant_with_one_bf16_shard_writes_an_output(capsys, tmp_path):
    from repair.demo.examples import TINY, write_assistant
    from safetensors.torch import load_file, save_file

    src = write_assistant(tmp_path / "src", TINY, broken=False)
    up = "model.layers.0.mlp.up_proj"
    for f in sorted(src.glob("*.safetensors")):
        tensors = load_file(f)
        if f"{up}.weight_scale" in tensors:
            value = nvfp4.dequantize(tensors[f"{up}.weight"], tensors[f"{up}.weight_scale"], tensors[f"{up}.weight_scale_2"])
            tensors = {k: v for k, v in tensors.items() if not k.startswith(up + ".")} | {f"{up}.weight": value}
            save_file(tensors, f, metadata={"format": "pt"})
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", TARGET)
    assert code == 0, (text, err)
    assert not [f for f in findings(capsys, tmp_path / "out", "--strict") if f["severity"] in ("error", "warning")]


def test_shards_excluded_by_their_own_names_leave_the_merged_layer_quantized(capsys, tmp_path):
    """vLLM asks its quant config about the merged layer by its own name (qkv_proj), never a shard's: q/k/v_proj all
    stored BF16 and excluded one by one still build qkv_proj NVFP4, and the load stops on the BF16 weight (measured with
    vLLM 0.32: AssertionError in load_qkv_weight, the tier's StableLM with its fixed output's qkv_proj entry removed).
    doctor said nothing and fix wrote nothing; an entry whose pattern matches the merged name (`*v_proj`) excludes it."""
    gen = torch.Generator().manual_seed(2)
    shards = [f"model.layers.{n}.self_attn.{leaf}" for n in range(2) for leaf in ("q_proj", "k_proj", "v_proj")]
    bf16 = {f"{s}.weight": (torch.randn(32, 32, generator=gen) * 0.05).to(torch.bfloat16) for s in shards}
    src = export(tmp_path / "src", "StableLmForCausalLM", "stablelm", bf16, ["lm_head", *shards])
    errors = [f for f in findings(capsys, src) if f["severity"] == "error"]
    assert errors and all(".self_attn." in f["subject"] for f in errors), errors
    assert all("self_attn.qkv_proj'" in f["message"] for f in errors), errors  # the name to exclude, the one asked
    out = tmp_path / "out"
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET)
    assert code == 0, (text, err)
    entries = read_json(out / "hf_quant_config.json")["quantization"]["exclude_modules"]
    assert {f"model.layers.{n}.self_attn.qkv_proj" for n in range(2)} <= set(entries), entries
    assert not [f for f in findings(capsys, out, "--strict") if f["severity"] in ("error", "warning")]
    wild = export(tmp_path / "wild", "StableLmForCausalLM", "stablelm", bf16, ["lm_head", "*v_proj", "*q_proj", "*k_proj"])
    assert not [f for f in findings(capsys, wild) if f["severity"] == "error"]
