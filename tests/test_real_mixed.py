"""inspect, doctor --strict, fix --target bf16 and recipes selecting by algorithm on the nvidia/Qwen3.6-35B-A3B-NVFP4
layout: a ModelOpt MIXED_PRECISION MoE (W4A16_NVFP4 routed and shared experts and lm_head, FP8 linear- and
full-attention, FP8 KV cache) with an MTP block excluded by `mtp*` wildcards.

The fixture (tools/real_fixture.py write_qwen36) has the real architecture (transformers' Qwen3_5Moe class, 40
layers) at tiny widths; its config files are written by ModelOpt's own code from a per-layer map reconstructed from
published facts (tests/data/evidence/PROVENANCE.md), checked here against the stored audit of
the published file. Dequantized values are judged by ModelOpt's own dequantization (tools/modelopt_oracles.py).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.conftest import load_tensors, raw_bytes, read_json, run_captured
from tools.modelopt_export import modelopt_dequantize
from tools.modelopt_oracles import fp8_dequantize
from tools.real_fixture import write_qwen36

AUDIT = Path(__file__).resolve().parent / "data" / "evidence" / "qwen3.6-35b-a3b-nvfp4" / "w4a16-input-scale-audit.json"
QUANT_LEAVES = ("weight_scale", "weight_scale_2", "input_scale")
EXPERT = "model.language_model.layers.7.mlp.experts.2.down_proj"  # one module per algorithm, checked by value
SHARED = "model.language_model.layers.7.mlp.shared_expert.gate_proj"
FP8_LINEAR_ATTN = "model.language_model.layers.6.linear_attn.in_proj_qkv"
FP8_ATTN = "model.language_model.layers.7.self_attn.o_proj"


@pytest.fixture(scope="module")
def src(qwen36_export) -> Path:
    return qwen36_export


@pytest.fixture(scope="module")
def tensors(src) -> dict[str, torch.Tensor]:
    return load_tensors(src)


def layers_of(folder: Path) -> dict[str, str]:
    return {k: v["quant_algo"] for k, v in read_json(folder / "hf_quant_config.json")["quantization"]["quantized_layers"].items()}


def inspect_modules(capsys, folder: Path) -> dict[str, dict]:
    code, out, err = run_captured(capsys, "inspect", folder, "--json")
    assert code == 0, err
    return {m["name"]: m for m in json.loads(out)["modules"]}


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and raw_bytes(a) == raw_bytes(b)


def modelopt_bf16(t: dict[str, torch.Tensor], module: str) -> torch.Tensor:
    """ModelOpt's own BF16 dequantization of a stored module (FP8 or NVFP4-packed)."""
    if t[f"{module}.weight"].dtype == torch.float8_e4m3fn:
        return fp8_dequantize(t[f"{module}.weight"], t[f"{module}.weight_scale"], torch.bfloat16)
    return modelopt_dequantize(t[f"{module}.weight"], t[f"{module}.weight_scale"], t[f"{module}.weight_scale_2"])


def test_the_layout_reproduces_the_published_audit(src):
    """The audit script's own counting (r0b0tlab scripts/audit_w4a16_input_scales.py) on our hf_quant_config.json
    gives the published file's numbers; the MTP wildcards, producer and KV-cache algorithm are the published ones."""
    audit = json.loads(AUDIT.read_text())
    hf = read_json(src / "hf_quant_config.json")
    w4a16 = sorted(k for k, v in hf["quantization"]["quantized_layers"].items() if v.get("quant_algo") == "W4A16_NVFP4")
    routed = [k for k in w4a16 if k.endswith(".mlp.experts")]
    assert (len(w4a16), len(routed), len(w4a16) - len(routed)) == (
        audit["w4a16_targets"], audit["routed_expert_aggregate_targets"], audit["linear_targets"])
    q = hf["quantization"]
    assert (q["quant_algo"], q["kv_cache_quant_algo"], q["exclude_modules"], hf["producer"]["version"]) == (
        "MIXED_PRECISION", "FP8", ["mtp*", "mtp.layers.0*"], "0.44.0")
    cfg = read_json(src / "config.json")["quantization_config"]
    assert cfg["quantized_layers"] == q["quantized_layers"] and cfg["ignore"] == q["exclude_modules"]


def test_published_input_scales_variant_ships_them_on_every_w4a16_linear(tmp_path, capsys):
    """As the audit measured: 121 W4A16_NVFP4 linears, each with an input_scale. doctor reads them as NVFP4 tensors
    under a W4A16_NVFP4 declaration: one note naming how many (vLLM 0.32 builds them weight-only and drops the scale,
    so --strict passes on the published file), nothing else."""
    folder = write_qwen36(tmp_path / "published", published_input_scales=True)
    audit = json.loads(AUDIT.read_text())
    layers = layers_of(folder)
    linears = {k for k, v in layers.items() if v == "W4A16_NVFP4" and not k.endswith(".mlp.experts")}
    with_scale = {n.removesuffix(".input_scale") for n in load_tensors(folder) if n.endswith(".input_scale")
                  and layers.get(n.removesuffix(".input_scale")) == "W4A16_NVFP4"}
    assert len(with_scale) == audit["linear_input_scales_loaded"] and with_scale == linears
    code, out, _ = run_captured(capsys, "doctor", folder, "--json", "--strict")
    report = json.loads(out)
    assert (code, report["findings"]) == (0, [])
    assert [(n["code"], n["subject"]) for n in report["notes"]] == [("algorithm-mismatch", min(linears))]
    assert report["notes"][0]["message"].startswith(f"{len(linears)} layer(s) declared W4A16_NVFP4 store an input_scale ({min(linears)}, ...)")


def test_inspect_shows_every_module_as_declared(capsys, src):
    modules = inspect_modules(capsys, src)
    quantized = {n: m for n, m in modules.items() if m["algorithm"]}
    assert quantized and all(m["algorithm"] == m["declared_algorithm"] for m in quantized.values())
    experts = [m for n, m in modules.items() if ".mlp.experts." in n and not n.startswith("mtp.")]
    assert len(experts) == 40 * 4 * 3 and {m["algorithm"] for m in experts} == {"W4A16_NVFP4"}
    assert {modules[n]["algorithm"] for n in (FP8_ATTN, FP8_LINEAR_ATTN)} == {"FP8"}
    mtp = {n: m for n, m in modules.items() if n.startswith("mtp.") and len(m["stored_shape"]) == 2}  # linears, not norms
    never = re.compile(r"\.(mlp\.gate|shared_expert_gate)$")  # GateLinear / ReplicatedLinear(quant_config=None) in vLLM 0.32
    assert mtp and all((m["precision"], m["declared"]) == ("bf16", "-" if never.search(n) else "excluded") for n, m in mtp.items())
    gates = {n: m["declared"] for n, m in modules.items() if never.search(n) and not n.startswith("mtp.")}
    assert len(gates) == 40 * 2 and set(gates.values()) == {"-"}


def test_doctor_strict_is_clean(capsys, src):
    code, out, err = run_captured(capsys, "doctor", src, "--strict", "--json")
    report = json.loads(out)
    assert (code, report["findings"], report["notes"]) == (0, [], []), err


@pytest.fixture(scope="module")
def fixed_bf16(src, tmp_path_factory) -> Path:
    from tests.conftest import run_cli

    out = tmp_path_factory.mktemp("qwen36-bf16") / "bf16"
    assert run_cli("fix", src, "-o", out, "--target", "bf16", "--quiet") == 0
    return out


def test_fix_bf16_dequantizes_every_algorithm_like_modelopt(capsys, tensors, fixed_bf16):
    out = fixed_bf16
    fixed = load_tensors(out)
    assert all(t.dtype in (torch.bfloat16, torch.float32) for t in fixed.values())
    assert not [n for n in fixed if n.rpartition(".")[2] in QUANT_LEAVES + ("k_scale", "v_scale")]
    for module in (EXPERT, SHARED, FP8_LINEAR_ATTN, FP8_ATTN, "lm_head"):
        assert same(fixed[f"{module}.weight"], modelopt_bf16(tensors, module)), module
    untouched = [n for n in tensors if n.startswith(("mtp.", "model.visual.")) or n.endswith((".mlp.gate.weight", "norm.weight"))]
    assert untouched and all(same(fixed[n], tensors[n]) for n in untouched)
    assert "quantization_config" not in read_json(out / "config.json") and not (out / "hf_quant_config.json").exists()
    code, text, _ = run_captured(capsys, "doctor", out, "--target", "bf16", "--strict")
    assert code == 0, text


def test_fix_bf16_output_loads_in_transformers(tensors, fixed_bf16):
    """transformers' own Qwen3_5Moe class loads the output with no key missing, unexpected or mismatched (it fuses
    the per-expert weights itself), holds ModelOpt's dequantized values, and runs a forward."""
    from transformers import Qwen3_5MoeForConditionalGeneration

    model, info = Qwen3_5MoeForConditionalGeneration.from_pretrained(fixed_bf16, dtype=torch.bfloat16, output_loading_info=True)
    assert (info["missing_keys"], info["unexpected_keys"], info["mismatched_keys"]) == (set(), set(), set())
    layer, expert = EXPERT.split(".mlp.experts.")
    fused = model.get_submodule(f"{layer}.mlp.experts").down_proj[int(expert.split(".")[0])]
    assert same(fused.detach().contiguous(), modelopt_bf16(tensors, EXPERT))
    with torch.no_grad():
        logits = model(input_ids=torch.arange(8).reshape(1, 8)).logits
    assert logits.shape == (1, 8, 256) and torch.isfinite(logits).all()


def _recipe(tmp_path: Path, algorithm: str, pattern: str) -> Path:
    path = tmp_path / f"{algorithm}.toml"
    path.write_text(f'name = "dequantize-{algorithm.lower()}"\n\n[[rules]]\naction = "dequantize"\n'
                    f'modules = ["{pattern}"]\nalgorithm = "{algorithm}"\n')
    return path


@pytest.mark.parametrize("algorithm, pattern, changed", [
    ("W4A16_NVFP4", r"re:.*\\.mlp\\.experts\\..*", lambda n: ".mlp.experts." in n),  # every W4A16_NVFP4 routed expert
    ("FP8", "re:.*", lambda n: ".linear_attn." in n or ".self_attn." in n),  # every FP8 layer, whatever its name
])
def test_recipe_selecting_by_algorithm(capsys, src, tensors, tmp_path, algorithm, pattern, changed):
    """Only the selected algorithm's modules are dequantized (ModelOpt's values) and no longer declared quantized
    (removed from quantized_layers or excluded, as fix chooses; the two files agree); every other layer keeps its
    entry and every other tensor is byte-identical; doctor --strict is clean on the result."""
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--recipe", _recipe(tmp_path, algorithm, pattern), "--quiet")
    assert code == 0, err
    fixed = load_tensors(out)
    before, after = layers_of(src), layers_of(out)
    hit = {k for k, v in before.items() if v == algorithm and changed(k + ".")}
    assert hit and {k: v for k, v in after.items() if k not in hit} == {k: v for k, v in before.items() if k not in hit}
    assert read_json(out / "config.json")["quantization_config"]["quantized_layers"] == \
        read_json(out / "hf_quant_config.json")["quantization"]["quantized_layers"]
    modules, old = inspect_modules(capsys, out), inspect_modules(capsys, src)
    dequantized = {n for n, m in old.items() if m["algorithm"] == algorithm and changed(n + ".") and not n.startswith("mtp.")}
    assert dequantized and all((modules[n]["precision"], modules[n]["algorithm"], modules[n]["declared"]) ==
                               ("bf16", None, "excluded") for n in dequantized)
    assert all(modules[n]["algorithm"] == m["algorithm"] for n, m in old.items() if n not in dequantized)
    for name in {EXPERT, FP8_ATTN, FP8_LINEAR_ATTN} & dequantized:
        assert same(fixed[f"{name}.weight"], modelopt_bf16(tensors, name)), name
    kept = [n for n in tensors if not changed(n) or n.startswith("mtp.") or n.rpartition(".")[2] in ("k_scale", "v_scale")]
    assert all(same(fixed[n], tensors[n]) for n in kept)
    code, text, _ = run_captured(capsys, "doctor", out, "--strict")
    assert code == 0, text


# ----------------------------------------------------------------------------- what vLLM's Qwen3.5 class builds
GATE = "model.language_model.layers.0.mlp.shared_expert_gate"


@pytest.fixture(scope="module")
def quantized_gate(src, tmp_path_factory) -> Path:
    """The Gemma-assistant mistake on this layout: an exporter that quantized every Linear, shared_expert_gate
    included (packed NVFP4 by repair.codec, ModelOpt's bytes; declared W4A16_NVFP4 in both config files)."""
    import shutil

    from safetensors.torch import save_file

    from repair.codec import nvfp4

    folder = tmp_path_factory.mktemp("qwen36-gate") / "src"
    shutil.copytree(src, folder)
    stored = load_tensors(folder)
    packed, block, scale_2 = nvfp4.quantize(stored.pop(f"{GATE}.weight").float())
    stored.update({f"{GATE}.weight": packed, f"{GATE}.weight_scale": block, f"{GATE}.weight_scale_2": scale_2.reshape(())})
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
    for name, section in (("config.json", "quantization_config"), ("hf_quant_config.json", "quantization")):
        config = read_json(folder / name)
        config[section]["quantized_layers"][GATE] = {"quant_algo": "W4A16_NVFP4", "group_size": 16}
        (folder / name).write_text(json.dumps(config, indent=2))
    return folder


def test_a_quantized_shared_expert_gate_is_an_error_that_fix_target_repairs(capsys, quantized_gate, tmp_path):
    """vLLM 0.32 builds shared_expert_gate as ReplicatedLinear(quant_config=None): a packed one cannot load. doctor
    said only a warning (no row for Qwen3.5), so --target fixes that trust exit 0 passed it."""
    code, out, _ = run_captured(capsys, "doctor", quantized_gate, "--target", "vllm==0.32.0", "--json")
    findings = json.loads(out)["findings"]
    assert code == 1 and [(f["severity"], f["code"], f["subject"]) for f in findings] == [("error", "config-contradiction", GATE)]
    assert "ReplicatedLinear(quant_config=None)" in findings[0]["message"]
    fixed = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", quantized_gate, "-o", fixed, "--target", "vllm==0.32.0", "--quiet")
    assert code == 0, err
    before, after = load_tensors(quantized_gate), load_tensors(fixed)
    assert same(after[f"{GATE}.weight"], modelopt_bf16(before, GATE))
    assert GATE not in layers_of(fixed) and not [n for n in after if n.startswith(f"{GATE}.weight_scale")]
    assert all(same(after[n], t) for n, t in before.items() if not n.startswith(GATE + "."))
    code, text, _ = run_captured(capsys, "doctor", fixed, "--target", "vllm==0.32.0", "--strict")
    assert code == 0, text


def test_a_recipe_splitting_a_linear_attention_pair_is_refused(capsys, src, tmp_path):
    """vLLM 0.32 loads in_proj_qkv and in_proj_z into one in_proj_qkvz layer (Qwen3_5's packed_modules_mapping):
    dequantizing one of them wrote an output whose fused layer mixes FP8 and BF16."""
    layer = "model.language_model.layers.0.linear_attn"
    recipe = tmp_path / "qkv.toml"
    recipe.write_text(f'name = "qkv-only"\n\n[[rules]]\naction = "dequantize"\nmodules = ["{layer}.in_proj_qkv"]\n')
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and err.strip() == (
        f"error: {src}: the recipe turns {layer}.in_proj_qkv BF16 but leaves 1 module(s) of its layer quantized ({layer}.in_proj_z, ...): "
        f"vLLM loads {layer}.in_proj_qkvz as one fused layer in one scheme, so the output could not load; dequantize them "
        f"together (add {layer}.in_proj_z to the rule)")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("architecture, error", [("Qwen3NextForCausalLM", True), ("Qwen3_5MoeForCausalLM", True),
                                                 ("LlamaForCausalLM", False)])
def test_the_gate_roles_belong_to_the_qwen_next_family_only(capsys, tmp_path, architecture, error):
    """The same quantized `shared_expert_gate` is an error where vLLM builds Qwen3NextSparseMoeBlock (Qwen3-Next,
    Qwen3.5), and not a role-contradiction elsewhere (another family's layer of that name is built with the config)."""
    from safetensors.torch import save_file

    from repair.codec import nvfp4
    from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed

    layers = {**healthy_layers(), "model.layers.0.mlp.shared_expert_gate": "NVFP4"}
    folder = write_mixed(tmp_path / "src", layers)
    stored = load_tensors(folder)
    packed, block, scale_2 = nvfp4.quantize(torch.randn(1, 64))
    gate = "model.layers.0.mlp.shared_expert_gate"
    stored.update({f"{gate}.weight": packed, f"{gate}.weight_scale": block, f"{gate}.weight_scale_2": scale_2.reshape(()),
                   f"{gate}.input_scale": torch.tensor(0.01)})
    save_file(stored, folder / "model.safetensors", metadata={"format": "pt"})
    config = read_json(folder / "config.json")
    (folder / "config.json").write_text(json.dumps(dict(config, architectures=[architecture])))
    _, out, _ = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0", "--json")
    roles = [f for f in json.loads(out)["findings"] if f["code"] == "config-contradiction" and f["subject"] == gate]
    assert [f["severity"] for f in roles] == (["error"] if error else []), out


def test_mtp_fc_of_a_modelopt_fp8_checkpoint_is_not_an_unquantized_role(capsys, tmp_path):
    """vLLM 0.32 builds mtp.fc without the quant config only when the config is modelopt_fp4 (an NVFP4 quant_algo);
    a single-algo ModelOpt FP8 checkpoint's config is `modelopt`, which quantizes mtp.fc. doctor called the FP8
    mtp.fc an error ("under a plain NVFP4 config") and fix --target dequantized a layer vLLM builds FP8."""
    from safetensors.torch import save_file

    from repair.codec import fp8

    src = tmp_path / "src"
    src.mkdir()
    stored = {"model.language_model.embed_tokens.weight": torch.randn(64, 32).to(torch.bfloat16)}
    for name, shape in (("mtp.fc", (32, 64)), ("model.language_model.layers.0.self_attn.o_proj", (32, 32))):
        weight, scale = fp8.quantize(torch.randn(shape).to(torch.bfloat16), None)
        stored.update({f"{name}.weight": weight, f"{name}.weight_scale": scale, f"{name}.input_scale": torch.tensor(0.02)})
    save_file(stored, src / "model.safetensors")
    quantization = {"quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    (src / "config.json").write_text(json.dumps({"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                                                 "quantization_config": {"quant_method": "modelopt", **quantization}}))
    (src / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quantization}))
    code, out, _ = run_captured(capsys, "doctor", src, "--target", "vllm==0.32.0", "--json")
    assert code == 0 and not [f for f in json.loads(out)["findings"] if f["subject"] == "mtp.fc"], out
    assert inspect_modules(capsys, src)["mtp.fc"]["declared"] == "quantized"


def test_a_quantized_qwen3_next_router_is_an_error(capsys, tmp_path):
    """vLLM 0.32's Qwen3NextForCausalLM builds the same Qwen3NextSparseMoeBlock as Qwen3.5 (router GateLinear and
    shared_expert_gate without the quant config), but it had no row: a packed router passed doctor --target."""
    from safetensors.torch import save_file

    from repair.codec import nvfp4

    src = tmp_path / "src"
    src.mkdir()
    stored = {"model.embed_tokens.weight": torch.randn(64, 32).to(torch.bfloat16)}
    for name in ("model.layers.0.mlp.gate", "model.layers.0.mlp.shared_expert.down_proj"):
        packed, block, scale_2 = nvfp4.quantize(torch.randn(32, 32))
        stored.update({f"{name}.weight": packed, f"{name}.weight_scale": block, f"{name}.weight_scale_2": scale_2.reshape(()),
                       f"{name}.input_scale": torch.tensor(0.01)})
    save_file(stored, src / "model.safetensors")
    quantization = {"quant_algo": "NVFP4", "group_size": 16, "exclude_modules": ["lm_head"]}
    (src / "config.json").write_text(json.dumps({"architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
                                                 "quantization_config": {"quant_method": "modelopt", **quantization}}))
    (src / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt"}, "quantization": quantization}))
    code, out, _ = run_captured(capsys, "doctor", src, "--target", "vllm==0.32.0", "--json")
    findings = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
    assert code == 1 and [f["subject"] for f in findings] == ["model.layers.0.mlp.gate"], out
    assert "GateLinear" in findings[0]["message"]


def test_dequantizing_every_expert_of_a_layer_takes_its_routed_experts_key_out(capsys, src, tmp_path):
    """quantized_layers declares routed experts by one `...mlp.experts` key. Dequantizing all of a layer's experts took
    out their own entries and excluded them (what vLLM reads first) but left that key: TensorRT-LLM, which reads
    hf_quant_config.json's map, would still build the layer W4A16_NVFP4. Every other key stays; --dry-run says so."""
    layer = "model.language_model.layers.7.mlp.experts"
    recipe = tmp_path / "experts.toml"
    recipe.write_text(f'name = "layer-7-experts"\n\n[[rules]]\naction = "dequantize"\nmodules = ["{layer}.*"]\n')
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "dry", "--recipe", recipe, "--dry-run", "--json")
    assert code == 0, err
    assert json.loads(out)["plan"]["quantized_layers_removed"] == [layer]
    fixed = tmp_path / "out"
    assert run_captured(capsys, "fix", src, "-o", fixed, "--recipe", recipe, "--quiet")[0] == 0
    before, after = layers_of(src), layers_of(fixed)
    assert layer in before and after == {k: v for k, v in before.items() if k != layer}
    assert read_json(fixed / "config.json")["quantization_config"]["quantized_layers"] == \
        read_json(fixed / "hf_quant_config.json")["quantization"]["quantized_layers"]
    modules = inspect_modules(capsys, fixed)
    experts = {n: m for n, m in modules.items() if n.startswith(layer + ".")}
    assert experts and all((m["precision"], m["declared"]) == ("bf16", "excluded") for m in experts.values())
    code, text, _ = run_captured(capsys, "doctor", fixed, "--target", "vllm==0.32.0", "--strict")
    assert code == 0, text
