"""Non-Gemma ModelOpt NVFP4 exports in vLLM 0.32's real loader on CPU, as exported and after `fix --target bf16`,
against what `doctor` predicts (issue 18, second "Done when" point).

Fixtures: real ModelOpt 0.47 NVFP4 exports (tools/modelopt_export.py) of a tiny LlamaForCausalLM and a tiny
Qwen3MoeForCausalLM (per-expert NVFP4 experts, routers excluded by ModelOpt), the project's `fix --target bf16`
output of each, and the Llama export with its quantization config deleted (packed tensors, no declaration).
The project is used only through its CLI (`python -m repair`).

Consumer: tools/vllm_load.py, ONE process in the vLLM venv for all folders: `EngineArgs(model=DIR)` ->
`get_model` (vLLM's DefaultModelLoader, weights tracking on), described right before
process_weights_after_loading. CPU shims (tools/vllm_runtime.py): NVFP4 linears use vLLM's emulation kernel, and
NVFP4 MoE falls back to vLLM's EMULATION backend (`--moe-emulation`): stock 0.32 on CPU stops the MoE export in
ModelOptNvFp4FusedMoE.__init__ -> select_nvfp4_moe_backend with "NotImplementedError: No NvFp4 MoE backend
supports the deployment configuration." (a kernel-availability limit of the CPU host, not a checkpoint property;
the quant method each layer gets is decided before the backend is picked).

Expected tensors come from the folders' safetensors and from ModelOpt's own NVFP4 dequantization, laid out as
vLLM fuses them (q/k/v -> qkv_proj, gate/up -> gate_up_proj, experts -> routed_experts.w13/w2).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from .probe import REPO, VLLM_OWN_PARAMS, VLLM_PY, read_all, requires_vllm, sha

pytestmark = [pytest.mark.vllm, requires_vllm]

LOADER = REPO / "tools" / "vllm_load.py"
TARGET = "vllm==0.32.0"
MODELS = ("llama", "qwen3-moe")
ARCH = {"llama": "LlamaForCausalLM", "qwen3-moe": "Qwen3MoeForCausalLM"}
FUSED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
         "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
EXPERT = re.compile(r"(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj")
# the linears every layer of both models has, by vLLM name (the experts are checked separately)
LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj")
DENSE_MLP = ("mlp.gate_up_proj", "mlp.down_proj")


# --------------------------------------------------------------------------------------------------------------------
# the project's CLI and vLLM's loader, each as its own process
# --------------------------------------------------------------------------------------------------------------------
def ckpt_repair(*args) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "repair", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=600)


def doctor_json(folder: Path, target: str) -> dict:
    proc = ckpt_repair("doctor", folder, "--target", target, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    assert report["exit_code"] == proc.returncode
    return report


def vllm_load(dirs: list[Path]) -> list[dict]:
    """tools/vllm_load.py over `dirs` in one process: one result per dir."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(LOADER), "--hash", "--traceback", "--moe-emulation", *map(str, dirs)],
                          capture_output=True, text=True, timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [line["dir"] for line in lines] == list(map(str, dirs)), proc.stderr[-4000:]
    return lines


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from tools.modelopt_export import export_tiny_llama, export_tiny_qwen3_moe

    root = tmp_path_factory.mktemp("llama_vs_vllm")
    out = {"llama": export_tiny_llama(root / "llama"), "qwen3-moe": export_tiny_qwen3_moe(root / "qwen3-moe")}
    for model in MODELS:
        out[f"{model}-bf16"] = root / f"{model}-bf16"
        fixed = ckpt_repair("fix", out[model], "-o", out[f"{model}-bf16"], "--target", "bf16", "--quiet")
        assert fixed.returncode == 0, fixed.stderr
        out[f"{model}-mlp"] = root / f"{model}-mlp"
        fixed = ckpt_repair("fix", out[model], "-o", out[f"{model}-mlp"], "--recipe", "modelopt-dequantize-mlp", "--quiet")
        assert fixed.returncode == 0, fixed.stderr
    stripped = out["llama-no-quant-config"] = root / "llama-no-quant-config"
    shutil.copytree(out["llama"], stripped)
    (stripped / "hf_quant_config.json").unlink()
    config = json.loads((stripped / "config.json").read_text())
    del config["quantization_config"]
    (stripped / "config.json").write_text(json.dumps(config, indent=2))
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> dict[str, dict]:
    names = list(folders)
    return dict(zip(names, vllm_load([folders[n] for n in names])))


# --------------------------------------------------------------------------------------------------------------------
# expected parameters: checkpoint tensors in vLLM's fused layout
# --------------------------------------------------------------------------------------------------------------------
def _join(parts: list, scalar_as_1d: bool):
    import torch

    if len(parts) > 1:
        return torch.stack(parts) if parts[0].ndim == 0 else torch.cat(parts)
    return parts[0].reshape(1) if scalar_as_1d and parts[0].ndim == 0 else parts[0]


def vllm_module(module: str) -> str:
    """The vLLM module a checkpoint module's tensors load into (Llama / Qwen3-MoE load_weights)."""
    if m := EXPERT.fullmatch(module):
        return f"{m[1]}.experts.routed_experts"
    parent, dot, proj = module.rpartition(".")
    return parent + dot + FUSED.get(proj, (proj, 0))[0]


def vllm_layout(tensors: dict) -> dict:
    """Checkpoint name -> tensor, re-keyed and fused the way vLLM 0.32's Llama/Qwen3-MoE load_weights store them:
    shards concatenated along dim 0 (0-d per-tensor scales stacked, or made [1]); experts stacked along a new dim 0
    into routed_experts.w13_* (gate, up) / w2_* (down)."""
    import torch

    pieces: dict[str, dict[tuple[int, int], object]] = defaultdict(dict)
    for name, t in tensors.items():
        module, leaf = name.rsplit(".", 1)
        if m := EXPERT.fullmatch(module):
            pieces[f"{vllm_module(module)}.{'w2' if m[3] == 'down' else 'w13'}_{leaf}"][(int(m[2]), m[3] == "up")] = t
        else:
            pieces[f"{vllm_module(module)}.{leaf}"][(0, FUSED.get(module.rpartition(".")[2], (None, 0))[1])] = t
    out = {}
    for name, parts in pieces.items():
        if ".routed_experts." in name:
            experts = sorted({e for e, _ in parts})
            out[name] = torch.stack([_join([parts[k] for k in sorted(parts) if k[0] == e], False) for e in experts])
        else:
            out[name] = _join([parts[k] for k in sorted(parts)], True)
    return out


def modelopt_dequantized(folder: Path) -> dict:
    """Every tensor of a ModelOpt NVFP4 export, with each packed module replaced by ModelOpt's own BF16 dequantization."""
    from tools.modelopt_export import modelopt_dequantize

    t = read_all(folder)
    out = {k: v for k, v in t.items() if not k.endswith(("weight_scale", "weight_scale_2", "input_scale"))}
    for name in [k for k in out if f"{k}_scale_2" in t]:
        out[name] = modelopt_dequantize(t[name], t[f"{name}_scale"], t[f"{name}_scale_2"])
    return out


def assert_loaded_exactly(result: dict, expected: dict) -> None:
    assert result["ok"], result
    got = {k: v for k, v in result["params"].items() if not VLLM_OWN_PARAMS.search(k)}
    assert set(got) == set(expected), (sorted(set(got) - set(expected)), sorted(set(expected) - set(got)))
    for name, t in expected.items():
        assert got[name] == {"dtype": str(t.dtype).replace("torch.", ""), "shape": list(t.shape), "sha256": sha(t)}, name


def linear_methods(result: dict) -> dict[str, dict]:
    return {k: v for k, v in result["methods"].items() if k.endswith(LINEARS + DENSE_MLP + (".routed_experts",))}


# --------------------------------------------------------------------------------------------------------------------
# vLLM's behaviour
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model", MODELS)
def test_export_loads_nvfp4_as_stored(loaded, folders, model):
    """vLLM builds every attention/MLP linear (and the experts) with ModelOpt's NVFP4 method and loads the stored
    packed weights, block scales and global scales unchanged; embeddings, routers and lm_head stay BF16."""
    result = loaded[model]
    assert_loaded_exactly(result, vllm_layout(read_all(folders[model])))
    assert (result["architecture"], result["quantization"]) == (ARCH[model], "modelopt_fp4")
    methods = linear_methods(result)
    mlp = ("mlp.experts.routed_experts",) if model == "qwen3-moe" else DENSE_MLP
    assert set(methods) == {f"model.layers.{i}.{n}" for i in range(2) for n in LINEARS + mlp}
    for name, m in methods.items():
        nvfp4 = {"method": "ModelOptNvFp4FusedMoE", "scheme": None, "kernel": None} if name.endswith("experts") else \
            {"method": "ModelOptLinearMethod", "scheme": "KNvfp4Static", "kernel": "EmulationNvFp4LinearKernel"}
        assert m == nvfp4, name
    unquantized = {k: v["method"] for k, v in result["methods"].items() if k.endswith(("embed_tokens", "lm_head", ".gate"))}
    assert unquantized == {"model.embed_tokens": "UnquantizedEmbeddingMethod", "lm_head": "UnquantizedLinearMethod",
                           **({f"model.layers.{i}.mlp.gate": "UnquantizedLinearMethod" for i in range(2)}
                              if model == "qwen3-moe" else {})}


@pytest.mark.parametrize("model", MODELS)
def test_bf16_fix_loads_modelopt_dequantization(loaded, folders, model):
    """`fix --target bf16` output: vLLM reads no quantization, builds every layer unquantized with the logical shapes,
    and the BF16 weights it loads are bit-identical to ModelOpt's own dequantization of the export."""
    result = loaded[f"{model}-bf16"]
    assert_loaded_exactly(result, vllm_layout(modelopt_dequantized(folders[model])))
    assert (result["architecture"], result["quantization"]) == (ARCH[model], None)
    assert {v["method"] for v in result["methods"].values()} == \
        {"UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"} | \
        ({"UnquantizedFusedMoEMethod"} if model == "qwen3-moe" else set())
    assert all(v["dtype"] == "bfloat16" for k, v in result["params"].items() if not VLLM_OWN_PARAMS.search(k))


@pytest.mark.parametrize("model", MODELS)
def test_mlp_recipe_output_loads_with_its_mlps_unquantized(loaded, folders, model):
    """`fix --recipe modelopt-dequantize-mlp`: vLLM builds the dense MLPs or the whole expert set unquantized (the
    exclusions fix wrote name every expert, which vLLM's fused-experts rule needs) and keeps attention NVFP4; doctor
    predicts the load."""
    result = loaded[f"{model}-mlp"]
    assert result["ok"], result
    methods = linear_methods(result)
    for name, m in methods.items():
        want = "ModelOptLinearMethod" if name.endswith(LINEARS) else \
            "UnquantizedFusedMoEMethod" if name.endswith("experts") else "UnquantizedLinearMethod"
        assert m["method"] == want, (name, m)
    assert any(name.endswith("experts") for name in methods) == (model == "qwen3-moe")
    report = doctor_json(folders[f"{model}-mlp"], TARGET)
    assert report["runtime_stops_at"] == [] and report["exit_code"] == 0, report


def test_export_without_its_quant_config_stops_vllm(loaded):
    result = loaded["llama-no-quant-config"]
    assert not result["ok"]
    assert result["error_type"] == "ValueError"
    assert re.fullmatch(r"There is no module or parameter named 'layers\.0\.\w+\.\w+\.input_scale' in LlamaModel\. .*",
                        result["error"]), result["error"]


# --------------------------------------------------------------------------------------------------------------------
# doctor and inspect against it
# --------------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("folder, target", [(m, TARGET) for m in MODELS] +
                         [(f"{m}-bf16", t) for m in MODELS for t in ("bf16", TARGET)])
def test_doctor_predicts_the_load(loaded, folders, folder, target):
    """Every folder vLLM loaded: doctor reports no stop and exits 0 (also with --strict)."""
    assert loaded[folder]["ok"], loaded[folder]
    report = doctor_json(folders[folder], target)
    assert report["runtime_stops_at"] == [] and report["exit_code"] == 0, report
    assert ckpt_repair("doctor", folders[folder], "--target", target, "--strict").returncode == 0


@pytest.mark.parametrize("model", MODELS)
def test_inspect_precision_is_what_vllm_built(loaded, folders, model):
    """inspect's per-module precision and declared state: nvfp4 + "quantized" exactly where vLLM built the layer that
    module loads into with an NVFP4 method, bf16 and not "quantized" where vLLM built it unquantized."""
    proc = ckpt_repair("inspect", folders[model], "--json")
    assert proc.returncode == 0, proc.stderr
    methods = loaded[model]["methods"]
    for module in json.loads(proc.stdout)["modules"]:
        method = methods.get(vllm_module(module["name"]), {}).get("method")
        if method is None:
            assert module["precision"] == "bf16", module  # norms: vLLM gives them no quant method at all
            continue
        quantized = not method.startswith("Unquantized")
        assert (module["precision"] == "nvfp4", module["declared"] == "quantized") == (quantized, quantized), module


@pytest.mark.parametrize("model", MODELS)
def test_doctor_says_it_has_no_loader_profile(folders, model):
    out = ckpt_repair("doctor", folders[model], "--target", TARGET).stdout
    # vLLM 0.32's generated layer profile covers it (layer roles, fused layers), but its loader is not simulated
    assert (f"checked: format health, config consistency and exclusions for {ARCH[model]} (no loader simulation for it); "
            "its layer roles and fused layers are vllm 0.32.0's own (generated profile)") in out
    assert "no loader profile" not in out
    assert "healthy for this target" not in out


def test_doctor_predicts_the_stop_without_quant_config(loaded, folders):
    assert not loaded["llama-no-quant-config"]["ok"]
    report = doctor_json(folders["llama-no-quant-config"], TARGET)
    vllm_says = "ValueError: " + loaded["llama-no-quant-config"]["error"].split(" in LlamaModel.")[0]
    assert [stop["error"] for stop in report["runtime_stops_at"]] == [vllm_says], report  # the stop, as vLLM words it
    assert report["exit_code"] == 1 and any(f["severity"] == "error" for f in report["findings"]), report
