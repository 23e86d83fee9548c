"""A merged layer (one parameter the class's loader stacks without a packed_modules_mapping naming it) with one shard
stored BF16 and the others NVFP4, loaded by vLLM 0.32 itself, against doctor's fused-shards finding and fix's output.

Fixtures: a real ModelOpt 0.47 NVFP4 export of a tiny StableLM (tools/modelopt_export.py export_tiny_causal_lm; vLLM
0.32's stablelm.py stacks q/k/v_proj into one QKVParallelLinear by its load_weights' renames, and declares no packed
mapping), and a copy whose layer-0 k_proj is stored BF16 (its NVFP4 dequantized, scales removed); the tiny Gemma 4
assistant (repair/demo/examples.py) with its layer-0 up_proj stored BF16 (gemma4_mtp.py stacks gate/up the same way).

What vLLM 0.32 does: it builds the merged layer NVFP4 (the config declares every shard quantized) and stops on the
BF16 shard: `assert param_data.shape == loaded_weight.shape` in parameter.py load_qkv_weight (load_merged_column_weight
for gate_up_proj). fix --target dequantizes every shard and excludes the layer by its own name, the one vLLM asks its
quant config about; that output loads, with the layer unquantized.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured
from .probe import REPO, VLLM_PY, requires_vllm, run_probe

pytestmark = [pytest.mark.vllm, requires_vllm]

TARGET = "vllm==0.32.0"
ATTN = "model.layers.0.self_attn"


def stored_bf16(src: Path, dst: Path, module: str) -> Path:
    """A copy of `src` with `module` stored BF16 (its NVFP4 dequantized) and nothing else changed."""
    shutil.copytree(src, dst)
    for f in sorted(dst.glob("*.safetensors")):
        tensors = load_file(f)
        if f"{module}.weight_scale" in tensors:
            value = nvfp4.dequantize(tensors[f"{module}.weight"], tensors[f"{module}.weight_scale"],
                                     tensors[f"{module}.weight_scale_2"])
            tensors = {k: v for k, v in tensors.items() if not k.startswith(module + ".")} | {f"{module}.weight": value}
            save_file(tensors, f, metadata={"format": "pt"})
            return dst
    raise AssertionError(module)


def fix(src: Path, out: Path) -> Path:
    proc = subprocess.run([str(REPO / ".venv" / "bin" / "ckpt-repair"), "fix", str(src), "-o", str(out), "--target", TARGET,
                           "--quiet"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.fixture(scope="module")
def stablelm(tmp_path_factory) -> dict[str, Path]:
    from tools.modelopt_export import TINY_LLAMA, export_tiny_causal_lm

    root = tmp_path_factory.mktemp("merged-shards")
    dims = {k: TINY_LLAMA[k] for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                       "num_attention_heads", "num_key_value_heads", "max_position_embeddings")}
    export = export_tiny_causal_lm("StableLmConfig", "StableLmForCausalLM", dims, root / "export")
    split = stored_bf16(export, root / "split", f"{ATTN}.k_proj")
    return {"export": export, "split": split, "fixed": fix(split, root / "fixed")}


def vllm_load(dirs: list[Path]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_load.py"), *map(str, dirs)],
                          capture_output=True, text=True, timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines()]


def fused_shards(capsys, folder: Path) -> list[dict]:
    code, text, err = run_captured(capsys, "doctor", folder, "--target", TARGET, "--json")
    return [f for f in json.loads(text)["findings"] if f["code"] == "fused-shards"]


def test_vllm_stops_on_stablelms_merged_qkv_and_loads_fixs_output(stablelm, capsys):
    export, split, fixed = vllm_load([stablelm["export"], stablelm["split"], stablelm["fixed"]])
    assert export["ok"], export.get("error")
    assert not split["ok"] and split["error_type"] == "AssertionError", split
    assert fixed["ok"], fixed.get("error")
    assert fixed["methods"][f"{ATTN}.qkv_proj"]["method"] == "UnquantizedLinearMethod", fixed["methods"][f"{ATTN}.qkv_proj"]
    found = fused_shards(capsys, stablelm["split"])
    assert [f["subject"] for f in found] == [f"{ATTN}.qkv_proj"] and "load_qkv_weight" in found[0]["runtime_error"]
    assert fused_shards(capsys, stablelm["export"]) == [] and fused_shards(capsys, stablelm["fixed"]) == []


def test_vllm_loads_fixs_output_of_the_assistant_with_one_bf16_shard(tmp_path, capsys):
    from repair.demo.examples import TINY, write_assistant

    healthy = write_assistant(tmp_path / "healthy", TINY, broken=False)
    split = stored_bf16(healthy, tmp_path / "split", "model.layers.0.mlp.up_proj")
    fixed = fix(split, tmp_path / "fixed")
    (stopped,), (loaded,) = run_probe([split], "installed", 1, 0), run_probe([fixed], "installed", 1, 0)
    assert not stopped["ok"] and "AssertionError" in (stopped.get("error_type") or stopped.get("error", "")), stopped
    assert loaded["ok"], loaded.get("error")


def test_shards_excluded_by_their_own_names_do_not_exclude_the_merged_layer(stablelm, tmp_path, capsys):
    """fix's output with its qkv_proj entry removed: q/k/v_proj BF16 and excluded one by one. vLLM 0.32 asks its
    config about qkv_proj only (is_layer_skipped: no packed mapping names the shards), builds it NVFP4 and stops on the
    BF16 weight; doctor reports each shard, naming the entry to write."""
    dropped = tmp_path / "shards-only"
    shutil.copytree(stablelm["fixed"], dropped)
    quant = json.loads((dropped / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] = [e for e in quant["quantization"]["exclude_modules"] if not e.endswith("qkv_proj")]
    assert f"{ATTN}.k_proj" in quant["quantization"]["exclude_modules"]
    (dropped / "hf_quant_config.json").write_text(json.dumps(quant))
    config = json.loads((dropped / "config.json").read_text())
    listed = config.get("quantization_config", {})
    for key in ("exclude_modules", "ignore"):
        if key in listed:
            listed[key] = [e for e in listed[key] if not e.endswith("qkv_proj")]
    (dropped / "config.json").write_text(json.dumps(config))
    (loaded,) = vllm_load([dropped])
    assert not loaded["ok"] and loaded["error_type"] == "AssertionError", loaded
    code, text, err = run_captured(capsys, "doctor", dropped, "--target", TARGET, "--json")
    errors = [f for f in json.loads(text)["findings"] if f["severity"] == "error"]
    assert code == 1 and {f["subject"] for f in errors} >= {f"{ATTN}.{leaf}" for leaf in ("q_proj", "k_proj", "v_proj")}, errors
    assert all(f"'{ATTN}.qkv_proj'" in f["message"] for f in errors if f["subject"].startswith(ATTN + ".")), errors
