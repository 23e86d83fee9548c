"""ModelOpt's NVFP4 layout for BMM-style 3-D experts (gpt-oss, Llama4: transformers' `mlp.experts.gate_up_proj`
[E, in, out]), read as one packed module per tensor (#26, stream gptoss).

ModelOpt 0.47 (modelopt/torch/export/unified_export_hf.py `_export_quantized_weight`) transposes such a weight to
[E, out, in], quantizes it with 16-element blocks along `in`, and transposes the packed bytes and the block scales
back: `X` uint8 [E, in/2, out], `X_weight_scale` float8 [E, in/16, out], `X_weight_scale_2` and `X_input_scale` float32
scalars (leaf names from quant_utils' quantizer_attr_names(`X`)); `X_bias` stays BF16 [E, out]. tools/
modelopt_gptoss_export.py writes the real thing (the vLLM tier loads it); this builds the same names and shapes in code.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from repair.codec import nvfp4
from tests.conftest import run_captured

E, HIDDEN, INTER = 4, 64, 32


def _transposed_nvfp4(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """ModelOpt's leaves for a 3-D [E, in, out] weight: each expert quantized as [out, in], bytes and scales transposed."""
    scale_2 = nvfp4.global_scale(weight)
    packed, scales = zip(*(nvfp4.quantize(w.t().contiguous(), scale_2)[:2] for w in weight))
    return {"": torch.stack([p.t().contiguous() for p in packed]), "_weight_scale": torch.stack([s.t().contiguous() for s in scales]),
            "_weight_scale_2": scale_2.reshape(()).float(), "_input_scale": torch.tensor(0.02)}


def gpt_oss_export(root: Path, original: Path | None = None) -> Path:
    """A tiny ModelOpt-style NVFP4 gpt-oss: packed attention, packed 3-D experts with underscore leaves, BF16 biases."""
    gen = torch.Generator().manual_seed(0)
    bf16: dict[str, torch.Tensor] = {}  # the model it was quantized from, as transformers saves it (`original`)
    tensors = {"model.embed_tokens.weight": torch.randn(128, HIDDEN, generator=gen).bfloat16(),
               "lm_head.weight": torch.randn(128, HIDDEN, generator=gen).bfloat16(),
               "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
    for layer in range(2):
        base = f"model.layers.{layer}"
        o = bf16[f"{base}.self_attn.o_proj.weight"] = (torch.randn(HIDDEN, HIDDEN, generator=gen) * 0.05).bfloat16()
        packed, scale, scale_2 = nvfp4.quantize(o, nvfp4.global_scale(o))
        tensors.update({f"{base}.self_attn.o_proj.weight": packed, f"{base}.self_attn.o_proj.weight_scale": scale,
                        f"{base}.self_attn.o_proj.weight_scale_2": scale_2, f"{base}.self_attn.o_proj.input_scale": torch.tensor(0.01),
                        f"{base}.mlp.router.weight": torch.randn(E, HIDDEN, generator=gen).bfloat16(),
                        f"{base}.mlp.router.bias": torch.zeros(E, dtype=torch.bfloat16)})
        for proj, (inn, out) in (("gate_up_proj", (HIDDEN, 2 * INTER)), ("down_proj", (INTER, HIDDEN))):
            weight = bf16[f"{base}.mlp.experts.{proj}"] = (torch.randn(E, inn, out, generator=gen) * 0.05).bfloat16()
            tensors.update({f"{base}.mlp.experts.{proj}{leaf}": t for leaf, t in _transposed_nvfp4(weight).items()})
            tensors[f"{base}.mlp.experts.{proj}_bias"] = torch.zeros(E, out, dtype=torch.bfloat16)
    root.mkdir(parents=True)
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    if original is not None:
        original.mkdir(parents=True)
        save_file({n: t for n, t in tensors.items() if t.dtype == torch.bfloat16} | bf16, original / "model.safetensors")
        (original / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss"}))
    excluded = ["lm_head", "model.embed_tokens", "model.layers.0.mlp.router", "model.layers.1.mlp.router"]
    (root / "config.json").write_text(json.dumps({"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss",
                                                  "quantization_config": {"quant_algo": "NVFP4", "quant_method": "modelopt",
                                                                          "ignore": excluded}}))
    (root / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": excluded}}))
    return root


def test_inspect_reads_each_3d_experts_tensor_as_one_packed_module(tmp_path, capsys):
    src = gpt_oss_export(tmp_path / "src")
    code, out, err = run_captured(capsys, "inspect", "--json", src)
    assert code == 0, out + err
    modules = {m["name"]: m for m in json.loads(out)["modules"]}
    for proj, logical in (("gate_up_proj", [E, HIDDEN, 2 * INTER]), ("down_proj", [E, INTER, HIDDEN])):
        m = modules[f"model.layers.0.mlp.experts.{proj}"]
        assert (m["precision"], m["logical_shape"]) == ("nvfp4", logical), m
        assert m["stored_shape"] == [E, logical[1] // 2, logical[2]], m
        assert not any(n.startswith(f"model.layers.0.mlp.experts.{proj}_weight_scale") for n in modules), sorted(modules)


def test_inspects_table_lists_the_packed_3d_experts(tmp_path, capsys):
    src = gpt_oss_export(tmp_path / "src")
    code, out, err = run_captured(capsys, "inspect", src)
    row = next((line for line in out.splitlines() if line.startswith("model.layers.1.mlp.experts.gate_up_proj ")), "")
    assert code == 0 and row.split()[1] == "nvfp4" and "[4, 32, 64]" in row and "[4, 64, 64]" in row, out


def test_doctor_predicts_vllms_own_refusal_with_its_words(tmp_path, capsys):
    """vLLM 0.32 builds the experts as one NVFP4 FusedMoE with no bias parameters; gpt_oss.py looks `down_proj_bias` up
    as `w2_bias` and raises (the profile's nvfp4_load_refused, fed through gpt_oss.py's load_weights by the generator)."""
    src = gpt_oss_export(tmp_path / "src")
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", src)
    assert code == 1 and "stored u8" not in out + err, out + err
    assert "model.layers.1.mlp.experts.down_proj: stored packed NVFP4" in out and "KeyError: 'layers.0.mlp.experts.w2_bias'" in out, out


def test_a_misshapen_block_scale_is_one_line_naming_the_tensor(tmp_path, capsys):
    src = gpt_oss_export(tmp_path / "src")
    from safetensors.torch import load_file
    tensors = load_file(src / "model.safetensors")
    name = "model.layers.1.mlp.experts.down_proj_weight_scale"
    tensors[name] = tensors[name][:, :1].contiguous()
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    code, out, err = run_captured(capsys, "fix", "--target", "bf16", src, "-o", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1 and name in err, out + err
    assert not (tmp_path / "out").exists()


def test_fix_dequantizes_the_experts_to_transformers_layout_and_excludes_their_fused_moe(tmp_path, capsys):
    """What vLLM loads (the tier: tests/vllm/test_gptoss_modelopt_vs_vllm.py): the experts BF16 [E, in, out] under their
    leafless names, their scales gone, the biases kept, and the FusedMoE prefix `...mlp.experts` excluded."""
    from safetensors.torch import load_file

    src = gpt_oss_export(tmp_path / "src")
    stored = load_file(src / "model.safetensors")
    for target in ("vllm==0.32.0", "bf16"):
        out_dir = tmp_path / target.replace("=", "")
        code, out, err = run_captured(capsys, "fix", "--target", target, src, "-o", out_dir)
        assert code == 0, out + err
        assert run_captured(capsys, "doctor", "--strict", "--target", target, out_dir)[0] == 0
        written = load_file(out_dir / "model.safetensors")
        for layer in range(2):
            for proj in ("gate_up_proj", "down_proj"):
                name = f"model.layers.{layer}.mlp.experts.{proj}"
                assert not any(n.startswith(name + "_weight") or n.startswith(name + "_input") for n in written), sorted(written)
                assert torch.equal(written[name + "_bias"], stored[name + "_bias"])
                experts = [nvfp4.dequantize(p.t().contiguous(), s.t().contiguous(), stored[name + "_weight_scale_2"]).t()
                           for p, s in zip(stored[name], stored[name + "_weight_scale"])]  # each expert: a Linear [out, in]
                assert written[name].dtype == torch.bfloat16 and torch.equal(written[name], torch.stack(experts)), name
    excluded = json.loads((tmp_path / "vllm0.32.0" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert {"model.layers.0.mlp.experts", "model.layers.1.mlp.experts"} <= set(excluded), excluded


def test_dequantized_experts_are_the_weights_modelopt_quantized(tmp_path, capsys):
    """Against the producer: the fix output's experts are the tiny gpt-oss's own weights up to NVFP4's rounding
    (~9% relative here), which a wrong nibble or block axis would not be (>100%)."""
    pytest.importorskip("modelopt")
    from safetensors.torch import load_file

    from tools.modelopt_export import _build_tiny_causal_lm
    from tools.modelopt_gptoss_export import TINY_GPT_OSS, export_gpt_oss

    src = export_gpt_oss(tmp_path / "src")
    assert run_captured(capsys, "fix", "--target", "vllm==0.32.0", src, "-o", tmp_path / "out")[0] == 0
    original = _build_tiny_causal_lm("GptOssConfig", "GptOssForCausalLM", TINY_GPT_OSS, 0).state_dict()
    written = load_file(tmp_path / "out" / "model.safetensors")
    for name in ("model.layers.0.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj"):
        want, got = original[name].float(), written[name].float()
        assert got.shape == want.shape and ((got - want).norm() / want.norm()).item() < 0.15, name


def test_fix_for_tensor_parallel_ranks_dequantizes_the_3d_experts_too(tmp_path, capsys):
    """--tp slices a dequantized weight per rank; a 3-D experts tensor is dequantized whole (per expert, transposed)
    and then sliced, and the ranks rebuild the single-checkpoint output byte for byte (unshard)."""
    src = gpt_oss_export(tmp_path / "src")
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", src, "-o", tmp_path / "one")
    assert code == 0, out + err
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.32.0", "--tp", "2", src, "-o", tmp_path / "tp")
    assert code == 0, out + err
    code, out, err = run_captured(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "back")
    assert code == 0, out + err
    from safetensors.torch import load_file
    one, back = load_file(tmp_path / "one" / "model.safetensors"), {}
    for f in sorted((tmp_path / "back").glob("*.safetensors")):
        back.update(load_file(f))
    assert one.keys() == back.keys() and all(torch.equal(one[k], back[k]) for k in one)


def _recipe(path: Path, action: str, modules: list[str]) -> Path:
    path.write_text(f'name = "t"\ndescription = "t"\n[[rules]]\naction = "{action}"\nmodules = {json.dumps(modules)}\n')
    return path


def test_take_original_reads_the_originals_leafless_3d_experts(tmp_path, capsys):
    """transformers' BF16 original names the experts `...experts.gate_up_proj` (no `.weight`): take_original takes them."""
    src = gpt_oss_export(tmp_path / "src")
    assert run_captured(capsys, "fix", "--target", "bf16", src, "-o", tmp_path / "orig")[0] == 0
    recipe = _recipe(tmp_path / "r.toml", "take_original", ["model.layers.0.mlp.experts.*"])
    code, out, err = run_captured(capsys, "fix", "--recipe", recipe, "--original", tmp_path / "orig", "--force", src,
                                  "-o", tmp_path / "out")  # a dequantized copy is not the model it was quantized from
    assert code == 0, out + err
    from safetensors.torch import load_file
    want, got = load_file(tmp_path / "orig" / "model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
    assert torch.equal(got["model.layers.0.mlp.experts.down_proj"], want["model.layers.0.mlp.experts.down_proj"])


def test_requantizing_3d_experts_is_refused_in_one_line(tmp_path, capsys):
    src = gpt_oss_export(tmp_path / "src")
    assert run_captured(capsys, "fix", "--target", "bf16", src, "-o", tmp_path / "orig")[0] == 0
    recipe = _recipe(tmp_path / "r.toml", "requantize", ["model.layers.0.mlp.experts.*"])
    code, out, err = run_captured(capsys, "fix", "--recipe", recipe, "--original", tmp_path / "orig", src, "-o", tmp_path / "out")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "3-D" in err and not (tmp_path / "out").exists(), out + err


def test_the_original_of_3d_experts_is_verified_by_requantizing_each_expert(tmp_path, capsys):
    """fix --original checks the original reproduces the stored codes; the 3-D experts count, quantized as ModelOpt
    did (each expert transposed), so the true original passes without --force."""
    src = gpt_oss_export(tmp_path / "src", original=tmp_path / "orig")
    recipe = _recipe(tmp_path / "r.toml", "take_original", ["model.layers.0.mlp.experts.*"])
    code, out, err = run_captured(capsys, "fix", "--recipe", recipe, "--original", tmp_path / "orig", src, "-o", tmp_path / "out")
    assert code == 0 and "original verified: 6 of 6 modules reproduce byte-for-byte" in out, out + err


def test_a_packed_3d_tensor_beside_a_module_of_the_same_name_is_refused_in_one_line(tmp_path, capsys):
    """`X` (packed experts) and `X.weight` would both be module X: which one a check reads would be an accident."""
    from safetensors.torch import load_file
    src = gpt_oss_export(tmp_path / "src")
    tensors = load_file(src / "model.safetensors")
    tensors["model.layers.0.mlp.experts.gate_up_proj.weight"] = torch.zeros(4, 4, dtype=torch.bfloat16)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    for command in (("inspect",), ("doctor", "--target", "vllm==0.32.0")):
        code, out, err = run_captured(capsys, *command, src)
        assert code == 2 and len(err.strip().splitlines()) == 1, out + err
        assert "model.layers.0.mlp.experts.gate_up_proj.weight" in err and "gate_up_proj_weight_scale" in err, err
