"""TensorRT-LLM fuses a checkpoint shard only into a layer its model builds (#28).

TensorRT-LLM's rules borrow vLLM 0.32's layer rows, whose fused layers are named by leaf (`gate_up_proj` from
`gate_proj`, `up_proj`). Afmoe's attention has its own `self_attn.gate_proj` (the sigmoid output gate) and no
`up_proj`: TensorRT-LLM's AfmoeAttention builds it as its own Linear (modeling_afmoe.py), never a `gate_up_proj`, so
doctor must not predict a fused `self_attn.gate_up_proj` whose `up_proj` is missing. Where a release builds a shard
outside the leaf fusion is its rules data (`rules.own_layers`), read from its source (tests/data/trtllm/PROVENANCE.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from repair.codec import nvfp4
from repair.targets.profiles import resolve
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

RELEASES = ("trtllm==1.4.0",)  # the release whose rules read modeling_afmoe.py (PROVENANCE.md)
HIDDEN = 32


def packed(gen: torch.Generator, name: str, rows: int) -> dict[str, torch.Tensor]:
    """ModelOpt's NVFP4 leaves of one linear [rows, HIDDEN]; one weight_scale_2 for all, as fused siblings share it."""
    weight = (torch.randn(rows, HIDDEN, generator=gen) * 0.05).clamp(-0.2, 0.2).to(torch.bfloat16)
    q, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(torch.tensor([0.2])))
    return {f"{name}.weight": q, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
            f"{name}.input_scale": torch.tensor(0.01)}


def afmoe_export(root: Path, excluded_bf16: tuple[str, ...] = ()) -> Path:
    """A tiny Afmoe NVFP4 export: each layer's attention q/k/v and output gate, a dense MLP's gate/up/down, packed;
    the modules in `excluded_bf16` stored BF16 and listed in exclude_modules."""
    gen = torch.Generator().manual_seed(3)
    extra: dict[str, torch.Tensor] = {}
    for layer in range(2):
        for leaf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.gate_proj",
                     "mlp.gate_proj", "mlp.up_proj"):
            name = f"model.layers.{layer}.{leaf}"
            if name in excluded_bf16:
                extra[f"{name}.weight"] = torch.randn(HIDDEN, HIDDEN, generator=gen).to(torch.bfloat16)
            else:
                extra |= packed(gen, name, HIDDEN)
        extra |= packed(gen, f"model.layers.{layer}.mlp.down_proj", HIDDEN)
    return export(root, "AfmoeForCausalLM", "afmoe", extra, ["lm_head", *excluded_bf16])


@pytest.mark.parametrize("spec", RELEASES)
def test_afmoe_attention_gate_is_not_a_fused_gate_up_shard(spec, tmp_path, capsys):
    src = afmoe_export(tmp_path / "src")
    code, out, err = run_captured(capsys, "doctor", "--target", spec, "--strict", "--json", src)
    report = json.loads(out)
    assert not any("self_attn.gate_up_proj" in json.dumps(f) for f in report["findings"]), out
    assert code == 0, out + err
    assert report["runtime_stops_at"] in (None, [], {}), out


def test_afmoe_attention_gate_excluded_alone_leaves_the_mlp_fusion_quantized(tmp_path, capsys):
    """The attention gate stored BF16 and excluded: its own layer, BF16; the MLP's gate_up_proj stays NVFP4 and loads."""
    src = afmoe_export(tmp_path / "src", ("model.layers.0.self_attn.gate_proj",))
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--strict", "--json", src)
    assert code == 0, out + err


def test_the_mlp_gate_up_fusion_still_holds_for_afmoe(tmp_path, capsys):
    """The MLP's gate_proj without its up_proj still stops TensorRT-LLM's fused gate_up loader."""
    src = afmoe_export(tmp_path / "src")
    shard = src / "model.safetensors"
    from safetensors.torch import load_file, save_file
    tensors = {k: v for k, v in load_file(shard).items() if not k.startswith("model.layers.0.mlp.up_proj.")}
    save_file(tensors, shard, metadata={"format": "pt"})
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--json", src)
    assert code == 1, out + err
    assert "model.layers.0.mlp.gate_up_proj" in json.dumps(json.loads(out)["runtime_stops_at"]), out


@pytest.mark.parametrize("spec", RELEASES)
def test_own_layers_data_cites_the_source_it_was_read_from(spec):
    rules = resolve(spec).profile.rules
    for arch, layers in rules.own_layers.items():
        assert layers and all(isinstance(x, str) and "." in x for x in layers), (spec, arch)
    assert rules.own_layers.get("AfmoeForCausalLM") == ("self_attn.gate_proj",)


def laguna_export(root: Path, scale_2: dict[str, float], excluded_bf16: tuple[str, ...] = ()) -> Path:
    """A tiny Laguna NVFP4 export: attention q/k/v and softplus gate g_proj, a dense MLP and a MoE layer's shared
    expert, packed but `excluded_bf16` (stored BF16, listed); `scale_2` overrides a module's weight_scale_2."""
    gen = torch.Generator().manual_seed(4)
    extra: dict[str, torch.Tensor] = {}
    mlps = ("mlp", "mlp.shared_expert")
    for layer, block in enumerate(mlps):
        for leaf in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.g_proj",
                     f"{block}.gate_proj", f"{block}.up_proj", f"{block}.down_proj"):
            name = f"model.layers.{layer}.{leaf}"
            extra |= packed(gen, name, HIDDEN)
            if name in excluded_bf16:
                extra = {k: v for k, v in extra.items() if not k.startswith(name + ".")}
                extra[f"{name}.weight"] = torch.randn(HIDDEN, HIDDEN, generator=gen).to(torch.bfloat16)
            if name in scale_2:
                extra[f"{name}.weight_scale_2"] = torch.tensor(scale_2[name])
    return export(root, "LagunaForCausalLM", "laguna", extra, ["lm_head", *excluded_bf16])


def test_laguna_mlp_and_shared_expert_load_as_fused_gate_up(tmp_path, capsys):
    """TensorRT-LLM's Laguna builds its dense MLP and its shared expert as GatedMLP (modeling_laguna.py): one fused
    gate_up_proj whose NVFP4 loader asserts one weight_scale_2 (vLLM 0.32's Laguna, whose rows are borrowed, builds
    them as separate linears). Healthy: clean; gate/up with different weight_scale_2: the assertion, at that layer."""
    healthy = laguna_export(tmp_path / "ok", {})
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--strict", "--json", healthy)
    assert code == 0, out + err
    for layer in ("model.layers.0.mlp", "model.layers.1.mlp.shared_expert"):
        src = laguna_export(tmp_path / layer, {f"{layer}.up_proj": 0.5})
        code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--json", src)
        stops = json.loads(out)["runtime_stops_at"]
        assert code == 1 and f"{layer}.gate_up_proj" in json.dumps(stops), out
        assert "The weight_scale_2 should be same for all the weights" in json.dumps(stops), out


def test_fix_makes_a_laguna_shared_expert_with_one_excluded_shard_load(tmp_path, capsys):
    """One shard of the shared expert's fused gate_up_proj excluded (BF16): TensorRT-LLM builds the whole layer BF16 and
    the packed up_proj cannot be copied in; fix dequantizes it and its output is clean under the same rules."""
    src = laguna_export(tmp_path / "src", {}, ("model.layers.1.mlp.shared_expert.gate_proj",))
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--json", src)
    assert code == 1 and "model.layers.1.mlp.shared_expert.up_proj" in json.dumps(json.loads(out)["runtime_stops_at"]), out
    code, out, err = run_captured(capsys, "fix", "--target", "trtllm==1.4.0", src, "-o", tmp_path / "out")
    assert code == 0, out + err
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--strict", tmp_path / "out")
    assert code == 0, out + err


def test_a_stray_attention_up_proj_beside_afmoes_own_gate_is_no_fused_layer(tmp_path, capsys):
    """A careless export also stores `self_attn.up_proj`: Afmoe's attention still builds no gate_up_proj (its gate is its
    own Linear), so doctor must not predict a fused gate_up loader stop there."""
    src = afmoe_export(tmp_path / "src")
    from safetensors.torch import load_file, save_file
    stray = packed(torch.Generator().manual_seed(9), "model.layers.0.self_attn.up_proj", HIDDEN)
    stray["model.layers.0.self_attn.up_proj.weight_scale_2"] = torch.tensor(0.5)  # unlike the gate's: no fused assertion
    tensors = load_file(src / "model.safetensors") | stray
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--json", src)
    assert "self_attn.gate_up_proj" not in out, out


def test_fix_dequantizes_an_excluded_packed_afmoe_attention_gate_alone(tmp_path, capsys):
    """The attention gate listed excluded but stored packed: TensorRT-LLM builds its own Linear BF16 and the copy fails;
    fix dequantizes that one module (no sibling: it is no fused shard) and the output is clean."""
    src = afmoe_export(tmp_path / "src")
    config = json.loads((src / "hf_quant_config.json").read_text())
    config["quantization"]["exclude_modules"].append("model.layers.0.self_attn.gate_proj")
    (src / "hf_quant_config.json").write_text(json.dumps(config))
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--json", src)
    assert code == 1 and "model.layers.0.self_attn.gate_proj" in json.dumps(json.loads(out)["runtime_stops_at"]), out
    code, out, err = run_captured(capsys, "fix", "--target", "trtllm==1.4.0", src, "-o", tmp_path / "out")
    assert code == 0 and "dequantize 1" in out, out + err
    code, out, err = run_captured(capsys, "doctor", "--target", "trtllm==1.4.0", "--strict", tmp_path / "out")
    assert code == 0, out + err
