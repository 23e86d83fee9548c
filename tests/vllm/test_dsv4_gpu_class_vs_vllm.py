"""vLLM 0.32's DeepSeek-V4 row is the class a GPU builds, in the published names, and doctor says what its loader does.

- vLLM's side, in its own process: tools/vllm_gpu_stand_ins.py cuda_classes takes the classes the package's CUDA branch
  imports (nvidia/model.py, nvidia/mtp.py) where this host imported its CPU ones, and the one device query their build
  makes (compute_fp8_einsum_recipe) answers with values every use of which raises and is recorded. The published
  names (tools/vllm_saved_names.py published_checkpoint: vLLM's own names read back through its mapper) of the BF16
  build of the profile's small config.
- A tiny export in those names under nvidia/DeepSeek-V4-Flash-NVFP4's real hf_quant_config.json (MIXED_PRECISION:
  routed experts NVFP4 by `quantized_layers`, attention, shared experts, head and MTP excluded), its quantized_layers
  cut to the tiny model's layers, is loaded by vLLM 0.32's own loader of the NVIDIA class (tools/vllm_load.py, weights
  tracked: every parameter filled, every name placed, or its exact error), and doctor --target vllm==0.32.0 must agree:
  alone (config.json without quantization_config) vLLM refuses the nested MIXED_PRECISION form; in config.json as
  ModelOpt's converter writes it, vLLM loads it and doctor agrees (no compressor where compress_ratios[i] is 0, no
  indexer where it is 0 or 128: the class's own per-layer build, learned by the profile); a compressor lost where
  the class builds one stops vLLM's tracked load and is doctor's missing module.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from repair.codec import nvfp4

from .probe import REPO, VLLM_PY, requires_vllm, run_oracle

pytestmark = [pytest.mark.vllm, requires_vllm]

REAL = REPO / "tests" / "data" / "real"
ARCH = "DeepseekV4ForCausalLM"

ORACLE = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
import vllm_runtime
vllm_runtime.enable_cpu_nvfp4(); vllm_runtime.torchvision_stand_in(); vllm_runtime.kernel_stand_ins()
from vllm import ModelRegistry
from vllm_gpu_stand_ins import cuda_classes
from vllm_profile import built_from
from vllm_profile_configs import model_types, small_config
from vllm_saved_names import published_checkpoint
from vllm.models.deepseek_v4.nvidia import flashmla

arch = "DeepseekV4ForCausalLM"
here = ModelRegistry._try_load_model_cls(arch).__module__
took = {k: v.__module__ for k, v in cuda_classes(arch).items()}
recipe, aligned = flashmla.compute_fp8_einsum_recipe()
uses = []
for use in (lambda: recipe[2], lambda: bool(aligned)):
    try:
        use(); uses.append("returned")
    except Exception as e:
        uses.append(type(e).__name__)
config = small_config(arch, model_types())[0]
model, _ = built_from(arch, config, False)
vllm_runtime.emit({"here": here, "took": took, "uses": uses, "calls": list(vllm_runtime.STAND_IN_CALLS),
                   "built": type(model).__module__, "config": config, "published": published_checkpoint(model)})
"""


@pytest.fixture(scope="module")
def oracle() -> dict:
    return run_oracle(ORACLE)


def test_the_gpu_class_is_built_and_its_device_query_decides_nothing(oracle):
    assert oracle["here"] == "vllm.models.deepseek_v4.cpu.model", oracle["here"]
    assert oracle["took"] == {ARCH: "vllm.models.deepseek_v4.nvidia.model",
                              "DeepSeekV4MTPModel": "vllm.models.deepseek_v4.nvidia.mtp"}, oracle["took"]
    assert oracle["built"] == "vllm.models.deepseek_v4.nvidia.model"
    assert oracle["uses"] == ["StubCalled", "StubCalled"], oracle["uses"]
    prefix = "vllm.models.deepseek_v4.nvidia.ops.o_proj.compute_fp8_einsum_recipe"
    assert oracle["calls"] == [f"{prefix}.einsum_recipe.__getitem__", f"{prefix}.tma_aligned_scales.__bool__"]


def test_published_names_are_the_native_layout(oracle):
    names = set(oracle["published"])
    assert {"embed.weight", "head.weight", "norm.weight", "hc_head_fn", "layers.0.attn.wq_a.weight",
            "layers.0.attn.wkv.weight", "layers.0.attn.kv_norm.weight", "layers.0.ffn.experts.0.w1.weight",
            "layers.0.ffn.shared_experts.w2.weight", "layers.1.attn.compressor.wgate.weight"} <= names, sorted(names)
    assert not [n for n in names if n.startswith(("model.", "lm_head"))]


def _nvfp4(modules: list[str], shapes: list[list[int]], gen: torch.Generator) -> dict[str, torch.Tensor]:
    """ModelOpt's NVFP4 leaves (weight, weight_scale, weight_scale_2, input_scale) of `modules` quantized as one, so they
    share one global scale, as ModelOpt exports an expert's gate and up (w1, w3)."""
    weight = (torch.randn(sum(s[0] for s in shapes), shapes[0][1], generator=gen) * 0.05).to(torch.bfloat16)
    packed, scale, scale_2 = nvfp4.quantize(weight)
    out, row = {}, 0
    for module, (rows, _) in zip(modules, shapes):
        out |= {f"{module}.weight": packed[row:row + rows].contiguous(), f"{module}.weight_scale": scale[row:row + rows].contiguous(),
                f"{module}.weight_scale_2": scale_2.clone(), f"{module}.input_scale": torch.tensor(0.01)}
        row += rows
    return out


def _restacked(oracle: dict, ratios: list[int]) -> dict[str, list[int]]:
    """The published names of a stack with these compress_ratios: each layer's attention as the tiny layer of the same
    ratio builds it, the rest (hash-routed gate or not, per num_hash_layers) as the tiny layer of the same kind."""
    config, published = oracle["config"], oracle["published"]
    by_ratio = {r: i for i, r in reversed(list(enumerate(config["compress_ratios"])))}
    hashed = config["num_hash_layers"]
    out = {n: s for n, s in published.items() if not n.startswith("layers.")}
    for layer, ratio in enumerate(ratios):
        for name, shape in published.items():
            source, _, rest = name.removeprefix("layers.").partition(".")
            if name.startswith("layers.") and int(source) == (by_ratio[ratio] if rest.startswith("attn.")
                                                                 else min(layer, hashed)):
                out[f"layers.{layer}.{rest}"] = shape
    return out


def write_nvidia_layout(folder: Path, oracle: dict, ratios: list[int] | None = None) -> Path:
    """The tiny export: published names, real hf_quant_config.json with quantized_layers cut to the tiny layers;
    `ratios`: a stack of that many layers with these compress_ratios instead of the tiny config's three."""
    folder.mkdir(parents=True)
    config = dict(oracle["config"], architectures=[ARCH], torch_dtype="bfloat16")
    config.pop("quantization_config", None)
    if ratios is not None:
        config |= {"num_hidden_layers": len(ratios), "compress_ratios": ratios}
    layers = config["num_hidden_layers"]
    hf_quant = json.loads((REAL / "deepseek-v4-flash-nvfp4" / "hf_quant_config.json").read_text())
    kept = {k: v for k, v in hf_quant["quantization"]["quantized_layers"].items() if int(k.split(".")[1]) < layers}
    hf_quant["quantization"]["quantized_layers"] = kept
    gen = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    published = oracle["published"] if ratios is None else _restacked(oracle, ratios)
    for name, shape in published.items():
        if ".ffn.experts." not in name:
            tensors[name] = (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)
        elif name.endswith(".w1.weight"):
            pair = [name.removesuffix(".weight"), name.removesuffix(".w1.weight") + ".w3"]
            tensors |= _nvfp4(pair, [shape, published[pair[1] + ".weight"]], gen)
        elif name.endswith(".w2.weight"):
            tensors |= _nvfp4([name.removesuffix(".weight")], [shape], gen)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "hf_quant_config.json").write_text(json.dumps(hf_quant, indent=4))
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def vllm_load(folder: Path) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_load.py"), "--moe-emulation", str(folder)],
                          env=clean, cwd="/", timeout=1200, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def doctor(folder: Path) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "repair", "doctor", str(folder), "--target", "vllm==0.32.0", "--json"],
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_the_real_hf_quant_config_alone_is_refused_as_doctor_says(oracle, tmp_path):
    """config.json without quantization_config (as ai-dynamo/aiconfigurator 7b359652 copied it, having dropped that key)
    beside the real hf_quant_config.json: vLLM 0.32 refuses MIXED_PRECISION in that nested form while reading the
    config, and doctor quotes its error."""
    folder = write_nvidia_layout(tmp_path / "dsv4-nvfp4", oracle)
    loaded = vllm_load(folder)
    code, report = doctor(folder)
    assert not loaded["ok"] and loaded["error_type"] == "ValidationError", loaded
    refused = [f for f in report["findings"] if f["code"] == "quant-config"]
    assert code == 1 and [f["runtime_error"] for f in refused] == ["ValueError: Unknown ModelOpt quant algo: MIXED_PRECISION"]
    said = refused[0]["runtime_error"].removeprefix("ValueError: ")  # pydantic wraps the ValueError vLLM raises
    assert f"Value error, {said}" in loaded["error"], loaded["error"]


def _in_config_json(folder: Path) -> Path:
    """The MIXED_PRECISION config moved into config.json as ModelOpt's own converter writes it (vLLM reads it first)."""
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = convert_hf_quant_config_format(json.loads((folder / "hf_quant_config.json").read_text()))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_the_mixed_config_in_config_json_loads_as_doctor_says(oracle, tmp_path):
    """The same export with the MIXED_PRECISION config in config.json: vLLM 0.32's NVIDIA class places every name
    (weights tracked), experts NVFP4, attention BF16, and doctor finds nothing missing."""
    folder = _in_config_json(write_nvidia_layout(tmp_path / "dsv4-nvfp4", oracle))
    loaded = vllm_load(folder)
    assert loaded["ok"], loaded.get("error")
    experts = {k: v["method"] for k, v in loaded["methods"].items() if ".ffn.experts" in k}
    assert experts and set(experts.values()) == {"ModelOptNvFp4FusedMoE"}, experts
    attention = {k: v["method"] for k, v in loaded["methods"].items() if ".attn." in k}
    assert attention and set(attention.values()) == {"UnquantizedLinearMethod"}, attention
    code, report = doctor(folder)
    assert code == 0 and not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]


@pytest.fixture(scope="module")
def published_stack(oracle, tmp_path_factory) -> Path:
    """The published DeepSeek-V4-Flash stack: 43 layers with its compress_ratios (0, 0, then 4 and 128 alternating;
    RedHatAI's config.json in tests/data/real, the same model), at the tiny dimensions."""
    ratios = json.loads((REAL / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json").read_text())["compress_ratios"]
    return _in_config_json(write_nvidia_layout(tmp_path_factory.mktemp("stack") / "dsv4-nvfp4", oracle, ratios))


def test_the_published_stack_loads_as_doctor_says(published_stack):
    """vLLM 0.32's NVIDIA class builds no compressor where compress_ratios[i] is 0 and no indexer where it is 0 or 128
    (models/deepseek_v4/attention.py:233-368): it loads the stack with every weight tracked, and doctor, which had
    called layers 0 and 1's compressor missing (41 of 43 layers store one), learns that from the profile's
    dropped_in_layers (generated from the class: tools/vllm_layer_facts.py where_rules)."""
    loaded = vllm_load(published_stack)
    assert loaded["ok"], loaded.get("error")
    code, report = doctor(published_stack)
    assert code == 0 and not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]


def test_a_compressor_lost_where_its_layer_builds_one_is_missing_for_both(published_stack, tmp_path):
    """Layer 4 (compress_ratios 4) without its compressor: vLLM's loader, weights tracked, stops on the unfilled
    fused_wkv_wgate, and doctor names its modules missing (and nothing in layers 0 and 1, which build none)."""
    folder = tmp_path / "lost"
    shutil.copytree(published_stack, folder)
    shard = folder / "model.safetensors"
    with safe_open(shard, "pt") as fh:
        kept = {k: fh.get_tensor(k) for k in fh.keys() if not k.startswith("layers.4.attn.compressor.")}
    save_file(kept, str(shard), metadata={"format": "pt"})
    loaded = vllm_load(folder)
    assert not loaded["ok"] and "layers.4.attn.compressor.fused_wkv_wgate" in loaded["error"], loaded
    code, report = doctor(folder)
    missing = [f["subject"] for f in report["findings"] if f["code"] == "missing-module"]
    assert code == 1 and missing == [f"layers.4.attn.compressor{m}" for m in ("", ".norm", ".wgate", ".wkv")], report["findings"]
