"""The tool on a REAL ModelOpt 0.47 MIXED_PRECISION export (tools/modelopt_mixed_export.py): FP8 attention, NVFP4,
W4A16_NVFP4 and NVFP4_AWQ MLPs, one excluded layer, FP8 KV cache, exactly as ModelOpt wrote it.

Judges: ModelOpt's own `quantized_layers` (what it declared per layer), ModelOpt's own dequantization
(NVFP4QTensor / FP8QTensor.dequantize, `disable_pre_quant_scale_and_resmooth` for the AWQ fold;
tools/modelopt_oracles.py) and transformers (loads the `fix --target bf16` output and runs it).

vLLM 0.32 and this export: see tests/vllm/test_mixed_vllm_load.py (its W4A16_NVFP4 linears have no CPU kernel, and
it builds the NVFP4_AWQ layer unquantized, so it cannot load the layer's packed tensors; doctor says so).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from repair.codec import awq, fp8, nvfp4
from tests.conftest import load_tensors, raw_bytes, read_json, run_captured
from tools.modelopt_export import modelopt_dequantize
from tools.modelopt_mixed_export import AWQ_LAYER, EXCLUDED_LAYER, build_mixed_llama
from tools.modelopt_oracles import fold_pre_quant_scale, fp8_dequantize

LEAVES = ("weight_scale", "weight_scale_2", "input_scale", "pre_quant_scale")


@pytest.fixture(scope="module")
def declared(mixed_export) -> dict[str, str]:
    """quantized_layers as ModelOpt wrote it: layer -> quant_algo."""
    layers = read_json(mixed_export / "hf_quant_config.json")["quantization"]["quantized_layers"]
    return {name: entry["quant_algo"] for name, entry in layers.items()}


@pytest.fixture(scope="module")
def tensors(mixed_export) -> dict[str, torch.Tensor]:
    return load_tensors(mixed_export)


def module_tensors(tensors: dict, layer: str) -> dict[str, torch.Tensor]:
    return {leaf: tensors[f"{layer}.{leaf}"] for leaf in ("weight", *LEAVES) if f"{layer}.{leaf}" in tensors}


def modelopt_bf16(t: dict[str, torch.Tensor], algo: str) -> torch.Tensor:
    """ModelOpt's own BF16 weight for a layer's exported tensors (AWQ: dequantized, then its own fold)."""
    if algo == "FP8":
        return fp8_dequantize(t["weight"], t["weight_scale"], torch.bfloat16)
    weight = modelopt_dequantize(t["weight"], t["weight_scale"], t["weight_scale_2"], torch.bfloat16)
    if algo == "NVFP4_AWQ":
        return fold_pre_quant_scale(weight, t["pre_quant_scale"], torch.ones(1, weight.shape[1]))
    return weight


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and raw_bytes(a) == raw_bytes(b)


def test_modelopt_wrote_a_mixed_precision_export(mixed_export, declared, tensors):
    """What the fixture is: ModelOpt's own config files and tensors, every algorithm present once at least."""
    hf = read_json(mixed_export / "hf_quant_config.json")["quantization"]
    cfg = read_json(mixed_export / "config.json")["quantization_config"]
    assert hf["quant_algo"] == cfg["quant_algo"] == "MIXED_PRECISION" and hf["kv_cache_quant_algo"] == "FP8"
    assert cfg["quantized_layers"] == hf["quantized_layers"] and "exclude_modules" not in hf
    assert set(declared.values()) == {"FP8", "NVFP4", "W4A16_NVFP4", "NVFP4_AWQ"} and declared[AWQ_LAYER] == "NVFP4_AWQ"
    assert EXCLUDED_LAYER not in declared and tensors[f"{EXCLUDED_LAYER}.weight"].dtype == torch.bfloat16
    assert tensors[f"{AWQ_LAYER}.pre_quant_scale"].shape == (128,)
    assert "model.layers.0.self_attn.k_proj.k_scale" in tensors and "model.layers.0.self_attn.v_proj.v_scale" in tensors


def test_inspect_shows_each_modules_algorithm_as_modelopt_declared_it(capsys, mixed_export, declared):
    code, out, err = run_captured(capsys, "inspect", mixed_export, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["format"] == "modelopt-mixed" and report["declaration"]["kv_cache"] == "FP8"
    modules = {m["name"]: m for m in report["modules"]}
    assert {n: (modules[n]["algorithm"], modules[n]["declared_algorithm"]) for n in declared} == {n: (a, a) for n, a in declared.items()}
    for unquantized in (EXCLUDED_LAYER, "lm_head"):
        m = modules[unquantized]
        assert (m["precision"], m["algorithm"], m["declared_algorithm"], m["declared"]) == ("bf16", None, None, "excluded")
    code, text, _ = run_captured(capsys, "inspect", mixed_export)
    rows = {line.split()[0]: line.split() for line in text.splitlines() if line.startswith("model.layers.")}
    assert all(rows[n][-3:] == ["quantized", a, a] for n, a in declared.items())


def test_doctor_on_modelopts_own_export(capsys, mixed_export, declared):
    """doctor --strict for vLLM 0.32: the scheme it predicts per layer is ModelOpt's declaration (NVFP4, W4A16_NVFP4,
    FP8; BF16 for the excluded layer and for NVFP4_AWQ, which has no vLLM linear method), and its one finding is that
    NVFP4_AWQ layer, which vLLM builds unquantized and cannot load (tests/vllm/test_mixed_vllm_load.py shows the
    stop). Nothing else: per-layer algorithms, the two files' maps, scale health and KV-cache scales all agree."""
    code, out, err = run_captured(capsys, "doctor", mixed_export, "--target", "vllm==0.32.0", "--strict", "--json")
    report = json.loads(out)
    assert code == 1, err
    built = {"NVFP4": "nvfp4", "W4A16_NVFP4": "w4a16_nvfp4", "FP8": "fp8", "NVFP4_AWQ": "bf16"}
    assert {n: s for n, s in report["schemes"].items() if n.startswith("model.layers.")} == {
        **{n: built[a] for n, a in declared.items()}, EXCLUDED_LAYER: "bf16"}
    assert [(f["severity"], f["subject"]) for f in report["findings"]] == [("error", AWQ_LAYER)] and report["notes"] == []


@pytest.mark.parametrize("algo", ["NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "FP8"])
def test_codec_dequantization_is_bitwise_modelopts_for_every_layer(declared, tensors, algo):
    """Every layer of the algorithm: repair.codec's dequantization (fp8 / nvfp4, + awq fold) == ModelOpt's, bit for bit."""
    layers = [n for n, a in declared.items() if a == algo]
    assert layers
    for layer in layers:
        t = module_tensors(tensors, layer)
        if algo == "FP8":
            ours = fp8.dequantize(t["weight"], t["weight_scale"], torch.bfloat16)
        elif algo == "NVFP4_AWQ":
            bits = awq.dequantize(t["weight"].numpy(), t["weight_scale"].view(torch.uint8).numpy(), t["weight_scale_2"].item(),
                                  t["pre_quant_scale"].float().numpy(), "BF16")
            ours = torch.from_numpy(bits).view(torch.bfloat16)
        else:
            ours = nvfp4.dequantize(t["weight"], t["weight_scale"], t["weight_scale_2"], torch.bfloat16)
        assert same_bits(ours, modelopt_bf16(t, algo)), layer


# ---------------------------------------------------------------------------------------------------------------------
# fix --target bf16 on the export (needs fix's MIXED_PRECISION support, branch fix19)
# ---------------------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fixed_bf16(mixed_export, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("mixed-fix") / "bf16"
    from tests.conftest import run_cli

    assert run_cli("fix", mixed_export, "-o", out, "--target", "bf16", "--quiet") == 0
    return out


def test_fix_bf16_output_is_modelopts_dequantization_and_plain_bf16(capsys, declared, tensors, fixed_bf16):
    """Every quantized layer's weight is ModelOpt's own BF16 (bitwise), every other tensor byte-identical, no
    quantization leaf or KV-cache scale left, no quantization config; doctor --target bf16 --strict is clean."""
    out = load_tensors(fixed_bf16)
    for layer, algo in declared.items():
        assert same_bits(out[f"{layer}.weight"], modelopt_bf16(module_tensors(tensors, layer), algo)), layer
    untouched = [n for n in tensors if n.rpartition(".")[0] not in declared and not n.endswith(("k_scale", "v_scale"))]
    assert untouched and all(same_bits(out[n], tensors[n]) for n in untouched)
    assert set(out) == {f"{layer}.weight" for layer in declared} | set(untouched)
    assert "quantization_config" not in read_json(fixed_bf16 / "config.json")
    assert not (fixed_bf16 / "hf_quant_config.json").exists()
    code, text, _ = run_captured(capsys, "doctor", fixed_bf16, "--target", "bf16", "--strict")
    assert code == 0, text


def _reference_model(declared: dict, tensors: dict, awq_scale: bool) -> torch.nn.Module:
    """The export's function with ModelOpt's BF16 weights: every quantized layer ModelOpt-dequantized (the AWQ layer NOT
    folded: its input is multiplied by pre_quant_scale in bf16 first, as ModelOpt's input quantizer does).
    awq_scale=False drops the scale: the wrong model the comparison must tell apart."""
    model = build_mixed_llama()
    state = {n: t for n, t in tensors.items() if n.rpartition(".")[0] not in declared and not n.endswith(("k_scale", "v_scale"))}
    for layer, algo in declared.items():
        t = module_tensors(tensors, layer)
        state[f"{layer}.weight"] = modelopt_bf16(t, "NVFP4" if algo == "NVFP4_AWQ" else algo)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not missing and not unexpected
    if awq_scale:
        scale = tensors[f"{AWQ_LAYER}.pre_quant_scale"]
        model.get_submodule(AWQ_LAYER).register_forward_pre_hook(lambda _m, args: (args[0] * scale,))
    return model


def test_fix_bf16_output_loads_in_transformers_and_computes_modelopts_function(declared, tensors, fixed_bf16):
    """transformers loads the output (every weight present and used); its logits equal those of ModelOpt's BF16 weights
    with the AWQ scale applied to the activations, within the bf16 rounding the fold moves (and dropping the scale
    would be seen)."""
    from transformers import LlamaForCausalLM

    fixed = LlamaForCausalLM.from_pretrained(fixed_bf16, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = fixed(input_ids=ids).logits.float()
        want = _reference_model(declared, tensors, True)(input_ids=ids).logits.float()
        wrong = _reference_model(declared, tensors, False)(input_ids=ids).logits.float()
    tolerance = 0.02 * want.abs().max()
    assert (got - want).abs().max() <= tolerance
    assert (wrong - want).abs().max() > 4 * tolerance, "dropping pre_quant_scale would pass too: the check proves nothing"
