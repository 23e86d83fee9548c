"""`fix` on ModelOpt MIXED_PRECISION and single W4A16_NVFP4 / NVFP4_AWQ / FP8 checkpoints, end to end through the CLI.

Every dequantized weight is compared bitwise with ModelOpt's own dequantization of the input's tensors
(FP8QTensor, NVFP4QTensor, and for NVFP4_AWQ its `disable_pre_quant_scale_and_resmooth` fold); tensors
no change touches are byte-identical; the configs are read back, and doctor (whose vLLM predictions
are checked against vLLM in tests/vllm) judges the output.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from tests.conftest import read_json, run_captured
from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed
from tools.modelopt_export import modelopt_dequantize
from tools.modelopt_oracles import fold_pre_quant_scale, fp8_dequantize


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("fix-mixed") / "healthy")


def load(folder: Path) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(folder.glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.dtype.itemsize])


def modelopt_full_precision(src: dict[str, torch.Tensor], module: str, algo: str) -> torch.Tensor:
    """ModelOpt's BF16 weight for a stored module of `algo` (the oracle, never our codec)."""
    t = {leaf: src[f"{module}.{leaf}"] for leaf in ("weight", "weight_scale", "weight_scale_2", "pre_quant_scale") if f"{module}.{leaf}" in src}
    if algo == "FP8":
        return fp8_dequantize(t["weight"], t["weight_scale"], torch.bfloat16)
    weight = modelopt_dequantize(t["weight"], t["weight_scale"], t["weight_scale_2"], torch.bfloat16)
    if algo == "NVFP4_AWQ":
        inputs = torch.randn(8, weight.shape[1], generator=torch.Generator().manual_seed(0))
        return fold_pre_quant_scale(weight, t["pre_quant_scale"], inputs)
    return weight


def fix(capsys, src: Path, out: Path, *args) -> str:
    code, text, err = run_captured(capsys, "fix", src, "-o", out, *args)
    assert code == 0, err
    return text


def assert_dequantized_like_modelopt(src: dict, out: dict, layers: dict[str, str]) -> None:
    for module, algo in layers.items():
        ours = out[f"{module}.weight"]
        assert ours.dtype == torch.bfloat16, module
        assert torch.equal(bits(ours), bits(modelopt_full_precision(src, module, algo))), f"{module} ({algo}) differs from ModelOpt"
        leftovers = [n for n in out if n.startswith(module + ".") and n != f"{module}.weight"]
        assert leftovers == [], f"{module} keeps {leftovers}"


def test_target_bf16_dequantizes_every_algorithm_and_drops_the_kv_cache(capsys, healthy, tmp_path):
    text = fix(capsys, healthy, tmp_path / "out", "--target", "bf16")
    assert "model.layers.1.mlp.down_proj: dequantize NVFP4_AWQ nvfp4 [64, 64] -> bf16 [64, 128] (pre_quant_scale folded into the weight)" in text
    assert "model.layers.0.self_attn.q_proj: dequantize FP8 f8_e4m3 [64, 64] -> bf16 [64, 64]; drop weight_scale, input_scale" in text
    assert ("KV-cache quantization: removed with it: 4 k_scale / v_scale tensor(s) dropped (model.layers.0.self_attn.k_proj.k_scale, ...) "
            "and the KV-cache declaration (kv_cache_quant_algo / kv_cache_scheme)") in text
    src, out = load(healthy), load(tmp_path / "out")
    assert_dequantized_like_modelopt(src, out, healthy_layers())
    assert not [n for n in out if n.endswith(("k_scale", "v_scale"))]
    for name in ("model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.layers.1.input_layernorm.weight"):
        assert torch.equal(bits(out[name]), bits(src[name])), name
    assert "quantization_config" not in read_json(tmp_path / "out" / "config.json")
    assert not (tmp_path / "out" / "hf_quant_config.json").exists()
    report = read_json(tmp_path / "out" / "repair_report.json")
    assert {c["module"]: c["algorithm"] for c in report["changes"] if c["action"] == "dequantize"} == healthy_layers()
    assert sorted(c["module"] for c in report["changes"] if c["action"] == "drop-kv-cache-scale") == sorted(
        n for n in src if n.endswith(("k_scale", "v_scale")))
    code, doctor_text, _ = run_captured(capsys, "doctor", tmp_path / "out", "--target", "bf16", "--strict")
    assert code == 0, doctor_text


def test_awq_fold_keeps_the_layers_function(capsys, healthy, tmp_path):
    """x @ folded.T equals ModelOpt's NVFP4_AWQ layer (x * pre_quant_scale) @ W.T, up to BF16 rounding of the fold."""
    fix(capsys, healthy, tmp_path / "out", "--target", "bf16")
    src, out = load(healthy), load(tmp_path / "out")
    module = "model.layers.1.mlp.down_proj"
    w = modelopt_dequantize(src[f"{module}.weight"], src[f"{module}.weight_scale"], src[f"{module}.weight_scale_2"], torch.float32)
    x = torch.randn(16, w.shape[1], generator=torch.Generator().manual_seed(1))
    expected = (x * src[f"{module}.pre_quant_scale"].float()) @ w.T
    got = x @ out[f"{module}.weight"].float().T
    assert torch.allclose(got, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())
    unfolded = x @ w.T  # without the fold the function changes: the test can fail
    assert not torch.allclose(unfolded, expected, rtol=2e-2, atol=2e-2 * expected.abs().max().item())


def test_a_recipe_dequantizing_some_layers_keeps_both_files_and_the_kv_cache(capsys, healthy, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "some"\n[[rules]]\naction = "dequantize"\nmodules = ["model.layers.1.mlp.down_proj", "model.layers.0.self_attn.o_proj"]\n')
    text = fix(capsys, healthy, tmp_path / "out", "--recipe", recipe)
    assert "KV-cache" not in text
    src, out = load(healthy), load(tmp_path / "out")
    layers = healthy_layers()
    done = {m: layers[m] for m in ("model.layers.1.mlp.down_proj", "model.layers.0.self_attn.o_proj")}
    assert_dequantized_like_modelopt(src, out, done)
    for name in src:
        if not any(name.startswith(m + ".") for m in done):
            assert torch.equal(bits(out[name]), bits(src[name])), name  # k_scale / v_scale included
    config, hf = read_json(tmp_path / "out" / "config.json"), read_json(tmp_path / "out" / "hf_quant_config.json")
    left = {k: v for k, v in layers.items() if k not in done}
    for qlayers in (config["quantization_config"]["quantized_layers"], hf["quantization"]["quantized_layers"]):
        assert {k: v["quant_algo"] for k, v in qlayers.items()} == left
    targets = [t for g in config["quantization_config"]["config_groups"].values() for t in g["targets"]]
    assert sorted(targets) == sorted(left)
    assert hf["quantization"]["kv_cache_quant_algo"] == "FP8" and config["quantization_config"]["kv_cache_scheme"]
    code, doctor_text, _ = run_captured(capsys, "doctor", tmp_path / "out", "--strict")
    assert code == 0, doctor_text


def single(folder: Path, algo: str) -> Path:
    """A single-algorithm checkpoint: every linear stored as `algo`, both files declaring quant_algo `algo`."""
    layers = {name: algo for name in healthy_layers()}
    write_mixed(folder, layers)
    for name, key in (("config.json", "quantization_config"), ("hf_quant_config.json", "quantization")):
        data = read_json(folder / name)
        section = data[key]
        for drop in ("quantized_layers", "config_groups"):
            section.pop(drop, None)
        section["quant_algo"] = algo
        section["exclude_modules" if key == "quantization" else "ignore"] = ["lm_head"]
        (folder / name).write_text(json.dumps(data))
    return folder


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "NVFP4_AWQ", "FP8"])
def test_single_algorithm_checkpoints(capsys, tmp_path, algo):
    src_dir = single(tmp_path / "src", algo)
    fix(capsys, src_dir, tmp_path / "bf16", "--target", "bf16")
    src, out = load(src_dir), load(tmp_path / "bf16")
    assert_dequantized_like_modelopt(src, out, {name: algo for name in healthy_layers()})
    module = "model.layers.0.mlp.down_proj"
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'name = "one"\n[[rules]]\naction = "dequantize"\nmodules = ["{module}"]\n')
    fix(capsys, src_dir, tmp_path / "one", "--recipe", recipe)
    assert_dequantized_like_modelopt(src, load(tmp_path / "one"), {module: algo})
    config, hf = read_json(tmp_path / "one" / "config.json"), read_json(tmp_path / "one" / "hf_quant_config.json")
    assert config["quantization_config"]["ignore"] == hf["quantization"]["exclude_modules"] == ["lm_head", module]
    assert config["quantization_config"]["quant_algo"] == hf["quantization"]["quant_algo"] == algo


def test_a_broken_fp8_scale_is_refused_before_writing(capsys, tmp_path):
    from tests.mixed_helpers import tensors_for

    tensors = tensors_for(healthy_layers())
    tensors["model.layers.0.self_attn.q_proj.weight_scale"] = torch.tensor(float("nan"))
    src = write_mixed(tmp_path / "src", tensors=tensors)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "bf16")
    assert code == 2 and not (tmp_path / "out").exists()
    assert err == (f"error: {src / 'model.safetensors'}: model.layers.0.self_attn.q_proj.weight_scale: FP8 weight scale is NaN, so every "
                   "dequantized value would be wrong; the export is broken: re-download it, or re-export from the original model\n")


def test_a_misshapen_pre_quant_scale_is_refused(capsys, tmp_path):
    from tests.mixed_helpers import tensors_for

    tensors = tensors_for(healthy_layers())
    tensors["model.layers.1.mlp.down_proj.pre_quant_scale"] = torch.ones(64, dtype=torch.bfloat16)
    src = write_mixed(tmp_path / "src", tensors=tensors)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "bf16")
    assert code == 2 and "model.layers.1.mlp.down_proj.pre_quant_scale: BF16 [64] is not a pre_quant_scale" in err
    assert err.count("\n") == 1


LLAMA_TP_PLAN = {"layers.*.self_attn.q_proj": "colwise", "layers.*.self_attn.k_proj": "colwise", "layers.*.self_attn.v_proj": "colwise",
                 "layers.*.self_attn.o_proj": "rowwise", "layers.*.mlp.gate_proj": "colwise", "layers.*.mlp.up_proj": "colwise",
                 "layers.*.mlp.down_proj": "rowwise"}  # transformers' LlamaConfig.base_model_tp_plan


@pytest.fixture(scope="module")
def with_tp_plan(tmp_path_factory) -> Path:
    """The healthy model with transformers' Llama tensor-parallel plan in config.json, so --tp splits its layers."""
    folder = write_mixed(tmp_path_factory.mktemp("fix-mixed-tp") / "src")
    config = read_json(folder / "config.json")
    config["base_model_tp_plan"] = LLAMA_TP_PLAN
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("args", [("--target", "bf16"), ("--recipe", "awq")])
def test_tp_ranks_rebuild_the_standard_output(capsys, with_tp_plan, tmp_path, args):
    """--tp 2 splits dequantized FP8 / NVFP4_AWQ weights and kept FP8 / NVFP4 layers; unshard gives fix's output byte for byte."""
    if args[1] == "awq":
        args = ("--recipe", tmp_path / "awq.toml")
        args[1].write_text('name = "awq"\n[[rules]]\naction = "dequantize"\nalgorithm = "NVFP4_AWQ"\n')
    text = fix(capsys, with_tp_plan, tmp_path / "tp", *args, "--tp", "2")
    assert "tensor(s) split" in text and " 0 tensor(s) split" not in text
    fix(capsys, with_tp_plan, tmp_path / "std", *args)
    code, _, err = run_captured(capsys, "unshard", tmp_path / "tp", "-o", tmp_path / "back")
    assert code == 0, err
    for name in [p.name for p in (tmp_path / "std").iterdir() if p.name != "repair_report.json"]:
        assert (tmp_path / "back" / name).read_bytes() == (tmp_path / "std" / name).read_bytes(), name


def test_tp_refuses_to_split_a_kept_awq_layer(capsys, with_tp_plan, tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text('name = "fp8"\n[[rules]]\naction = "dequantize"\nalgorithm = "FP8"\n')
    code, _, err = run_captured(capsys, "fix", with_tp_plan, "-o", tmp_path / "out", "--recipe", recipe, "--tp", "2")
    assert code == 2 and not (tmp_path / "out").exists()
    assert err == (f"error: {with_tp_plan}: --tp does not split NVFP4_AWQ pre_quant_scale yet (model.layers.1.mlp.down_proj.pre_quant_scale, "
                   "...); dequantize those layers (a recipe rule with algorithm = \"NVFP4_AWQ\") or run without --tp\n")


def test_inspect_doctor_fix_inspect(capsys, healthy, tmp_path):
    """The new user's path: inspect shows each algorithm; doctor finds the NVFP4_AWQ layer vLLM 0.32 cannot build;
    a vLLM 0.32 target dequantizes exactly that layer (pre_quant_scale folded), after which doctor is clean; bf16 is clean."""
    awq = "model.layers.1.mlp.down_proj"
    code, text, _ = run_captured(capsys, "inspect", healthy)
    assert code == 0 and "format: modelopt-mixed; declared: MIXED_PRECISION; excluded: -; KV cache: FP8" in text
    assert any(line.split()[0] == awq and "NVFP4_AWQ" in line for line in text.splitlines())
    code, text, _ = run_captured(capsys, "doctor", healthy, "--strict", "--target", "vllm==0.32.0")
    assert code == 1 and f"error: [runtime-scheme] {awq}: declared NVFP4_AWQ" in text
    fix(capsys, healthy, tmp_path / "v032", "--target", "vllm==0.32.0")
    src, out = load(healthy), load(tmp_path / "v032")
    assert_dequantized_like_modelopt(src, out, {awq: "NVFP4_AWQ"})
    assert {n for n in src if not n.startswith(awq + ".")} <= set(out)
    assert run_captured(capsys, "doctor", tmp_path / "v032", "--strict", "--target", "vllm==0.32.0")[0] == 0
    fix(capsys, healthy, tmp_path / "bf16", "--target", "bf16")
    code, text, _ = run_captured(capsys, "inspect", tmp_path / "bf16", "--json")
    report = json.loads(text)
    assert code == 0 and {m["precision"] for m in report["modules"]} == {"bf16"}


@pytest.mark.parametrize("name, value", [("model.layers.1.mlp.down_proj.pre_quant_scale", "nan-scale"),
                                         ("model.layers.0.self_attn.o_proj.weight", "nan-byte")])
def test_nan_results_are_refused_not_written(capsys, tmp_path, name, value):
    """A NaN per-channel scale, or an FP8 NaN byte (0x7F), would dequantize to NaN: refused, nothing written (the
    scale by planning's check of the values it folds, the byte by the writer's guard on the computed values)."""
    from tests.mixed_helpers import tensors_for

    tensors = tensors_for(healthy_layers())
    if value == "nan-scale":
        tensors[name] = tensors[name].clone()
        tensors[name][3] = float("nan")
    else:
        raw = tensors[name].view(torch.uint8).clone()
        raw[0, 0] = 0x7F
        tensors[name] = raw.view(torch.float8_e4m3fn)
    src = write_mixed(tmp_path / "src", tensors=tensors)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "bf16")
    assert code == 2 and not (tmp_path / "out").exists() and err.count("\n") == 1
    if value == "nan-scale":
        assert f"{name}: column 3 is nan" in err, err
    else:
        assert "of the BF16 values it gives are NaN or infinite (dequantize); nothing was written" in err


@pytest.mark.parametrize("target", ["bf16", "vllm==0.32.0"])
def test_a_float8_weight_without_its_scale_is_refused_not_written_raw(capsys, tmp_path, target):
    """Found by the attacker review: with o_proj's weight_scale missing, --target vllm==0.32.0 excluded the layer and
    kept its raw float8 codes, and --target bf16 kept a float8 weight in a 'bf16' output; both exited 0."""
    layers = {n: "NVFP4" if a == "NVFP4_AWQ" else a for n, a in healthy_layers().items()}
    tensors = tensors_for(layers)
    del tensors["model.layers.0.self_attn.o_proj.weight_scale"]
    src = write_mixed(tmp_path / "src", layers, tensors=tensors)
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", target)
    assert code == 2 and not (tmp_path / "out").exists()
    assert err == (f"error: {src}: model.layers.0.self_attn.o_proj.weight is f8_e4m3 without a float32 per-tensor weight_scale, "
                   "so its values cannot be read; restore the export's weight_scale, or take the module from the original model "
                   "(--original with a take_original rule)\n")


def test_fix_target_diagnoses_the_input_once(tmp_path, monkeypatch):
    """The derived recipe, the plan's stored-defect check and the report's 'before' each ask doctor about the input;
    a diagnosis reads every block scale, so it is computed once per checkpoint and target (and once for the output)."""
    import repair.doctor.diagnose as diagnose_module
    from repair import api
    from repair.planning.recipe import Recipe

    src = write_mixed(tmp_path / "src")
    seen = []
    real = diagnose_module._diagnose
    monkeypatch.setattr(diagnose_module, "_diagnose", lambda ckpt, target, tp, *how: seen.append(ckpt.root) or real(ckpt, target, tp, *how))
    api.run(api.plan(src, Recipe(name="t", target="vllm==0.32.0")), tmp_path / "out")
    assert seen[0] == src and len(seen) == 2 and seen[1].name.startswith(".out.partial-")  # the output, before it is published


def test_the_writers_last_guard_counts_blocks_as_blocks(capsys, tmp_path, monkeypatch):
    """The writer's own guard on NVFP4 (the plan-time check blinded here, as if it had missed them) counts the blocks
    whose scale gives a NaN, and said they were that many values: 3 NaN block scales are 48 values, not 3."""
    import os

    from repair.demo.examples import TINY, write_assistant
    from repair.formats import nvfp4_health, nvfp4_packed
    from repair.io.checkpoint import open_checkpoint

    src = write_assistant(tmp_path / "src", TINY)
    name = next(n for n in open_checkpoint(src).locate() if n.endswith("down_proj.weight_scale"))
    shard, info = open_checkpoint(src).locate()[name]
    with open(shard.path, "r+b") as fh:
        os.pwrite(fh.fileno(), bytes([0x7F]) * 3, info.start + 5)
    monkeypatch.setattr(nvfp4_packed, "block_scale_stats", lambda path, info: nvfp4_health.stats_of(b"\x38"))
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "bf16")
    assert code == 2 and not (tmp_path / "out").exists() and err.count("\n") == 1
    assert f"{name.removesuffix('_scale')}: 3 of the blocks of 16 BF16 values it gives hold a NaN or an infinity (dequantize)" in err, err
