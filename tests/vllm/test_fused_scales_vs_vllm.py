"""Fused siblings with different weight_scale_2, loaded by vLLM 0.32 itself, against doctor's siblings-scale-2 finding.

Fixtures: a real ModelOpt 0.47 NVFP4 export of a tiny Llama (tools/modelopt_export.py) and a copy whose layer-0
k_proj weight_scale_2 is doubled; the tiny Gemma 4 assistant (repair/demo/examples.py) with its layer-0 up_proj
weight_scale_2 doubled.

What vLLM 0.32 does (tools/vllm_load.py --global-scales; its modelopt.py KNvfp4Static.process): it builds q/k/v as one
qkv_proj whose weight_scale_2 holds one value per shard, loads the model without an error, logs "the global weight
scale differs across parallel layers" once, and keeps one global scale, the max, leaving the block scales' bytes as
loaded. So the shards with the smaller scale compute values too large by the ratio: what doctor's finding says.
The assistant: vLLM 0.32's Gemma4MTP builds gate/up as one gate_up_proj (gemma4_mtp.py's orig_to_new_stacked), whose
weight_scale_2 has one entry per shard (tools/vllm_probe.py), so its row's merged layer is checked too.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import run_captured
from .probe import REPO, VLLM_PY, requires_vllm, run_probe

pytestmark = [pytest.mark.vllm, requires_vllm]

TARGET = "vllm==0.32.0"
ATTN = "model.layers.0.self_attn"
WARNING = "the global weight scale differs across parallel layers"


def doubled(src: Path, dst: Path, name: str) -> Path:
    shutil.copytree(src, dst)
    files = sorted(dst.glob("*.safetensors"))
    for f in files:
        tensors = load_file(f)
        if name in tensors:
            tensors[name] = tensors[name] * 2
            save_file(tensors, f, metadata={"format": "pt"})
            return dst
    raise AssertionError(f"{name} not in {files}")


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict[str, Path]:
    from tools.modelopt_export import export_tiny_llama

    root = tmp_path_factory.mktemp("fused-scales")
    export = export_tiny_llama(root / "export")
    return {"export": export, "split": doubled(export, root / "split", f"{ATTN}.k_proj.weight_scale_2")}


def vllm_load(dirs: list[Path]) -> tuple[list[dict], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_load.py"), "--global-scales", "--traceback",
                           *map(str, dirs)], capture_output=True, text=True, timeout=1800, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr


def siblings(capsys, folder: Path) -> dict[str, str]:
    code, text, err = run_captured(capsys, "doctor", folder, "--target", TARGET, "--json")
    return {f["subject"]: f["message"] for f in json.loads(text)["findings"] if f["code"] == "siblings-scale-2"}


def test_vllm_keeps_the_max_global_scale_of_a_fused_layer_as_doctor_says(llama, capsys):
    (export, split), stderr = vllm_load([llama["export"], llama["split"]])
    assert export["ok"] and split["ok"], (export.get("error"), split.get("error"))
    stored = load_file(llama["split"] / "model.safetensors")
    shards = [stored[f"{ATTN}.{p}.weight_scale_2"].item() for p in ("q_proj", "k_proj", "v_proj")]
    qkv = split["global_scales"][f"{ATTN}.qkv_proj"]
    assert qkv["weight_scale_2"] == shards and len(set(shards)) == 2  # one value per shard, as stored
    assert qkv["weight_global_scale"] == max(shards)  # one global scale kept: the max
    before, after = qkv["weight_scale_sha256"]
    assert before == after  # the block scales are not rescaled to it
    assert WARNING in stderr and WARNING not in stderr.split(str(llama["split"]))[0]  # only a warning, for the split copy
    healthy = export["global_scales"][f"{ATTN}.qkv_proj"]
    assert len(set(healthy["weight_scale_2"])) == 1 and healthy["weight_global_scale"] == healthy["weight_scale_2"][0]

    assert siblings(capsys, llama["export"]) == {}
    found = siblings(capsys, llama["split"])
    assert list(found) == [f"{ATTN}.q_proj, {ATTN}.k_proj, {ATTN}.v_proj"], found
    message = found[f"{ATTN}.q_proj, {ATTN}.k_proj, {ATTN}.v_proj"]
    assert "vLLM takes the max without rescaling the block scales and loads the model without an error" in message


def test_vllm_builds_the_assistants_gate_and_up_as_one_layer_and_doctor_checks_it(tmp_path, capsys):
    from repair.demo.examples import TINY, write_assistant

    healthy = write_assistant(tmp_path / "healthy", TINY, broken=False)
    split = doubled(healthy, tmp_path / "split", "model.layers.0.mlp.up_proj.weight_scale_2")
    (line,) = run_probe([split], "installed", 1, 0)
    assert line["ok"], line.get("error")
    params = line["params"]
    fused = [n for n in params if n.endswith("layers.0.mlp.gate_up_proj.weight_scale_2")]
    assert len(fused) == 1 and params[fused[0]]["shape"] == [2], fused  # one layer, a global scale per shard
    assert not [n for n in params if ".mlp.gate_proj." in n or ".mlp.up_proj." in n]
    found = siblings(capsys, split)
    assert list(found) == ["model.layers.0.mlp.gate_proj, model.layers.0.mlp.up_proj"], found
    assert siblings(capsys, healthy) == {}
