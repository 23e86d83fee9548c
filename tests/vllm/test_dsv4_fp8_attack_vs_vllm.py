"""Attacks on DeepSeek-V4's `fp8` form judged by vLLM 0.32's own loader (tools/vllm_load.py, weights tracked, --hash:
each parameter's bytes as the weight loaders wrote them).

A float32 block scale that is not a power of two, with expert_dtype fp4: vLLM's `weight_scale_inv` is
float8_e8m0fnu (quant_config.py:80-84, fp8.py:329-336) and the loader's copy rounds the value into it, so the layer
computes with another scale than the export's; doctor must say so (it had said `nothing to do`)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tools import dsv4_fp8_fixture

from .probe import requires_vllm
from .test_dsv4_gpu_class_vs_vllm import REPO, VLLM_PY, doctor

pytestmark = [pytest.mark.vllm, requires_vllm]
WQ_B = "layers.0.attn.wq_b"


def _load_hashed(folder: Path) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(REPO / "tools" / "vllm_load.py"), "--moe-emulation", "--hash", str(folder)],
                          env=clean, cwd="/", timeout=1200, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_float32_scale_not_a_power_of_two_is_rounded_into_e8m0_as_doctor_says(tmp_path):
    stored = {}

    def edit(tensors):
        tensors[f"{WQ_B}.scale"] = stored["scale"] = tensors[f"{WQ_B}.scale"].to(torch.float32) * 1.3
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=edit)
    loaded = _load_hashed(folder)
    assert loaded["ok"], loaded.get("error")  # vLLM says nothing
    param = loaded["params"][f"model.{WQ_B}.weight_scale_inv"]
    rounded = stored["scale"].to(torch.float8_e8m0fnu).view(torch.uint8).numpy().tobytes()
    assert param["dtype"] == "float8_e8m0fnu" and param["sha256"] == hashlib.sha256(rounded).hexdigest(), param
    assert not torch.equal(stored["scale"].to(torch.float8_e8m0fnu).float(), stored["scale"])  # not the export's values
    code, report = doctor(folder)
    assert code == 1 and [f["subject"] for f in report["findings"] if f["severity"] == "error"] == [f"{WQ_B}.scale"]


def test_an_ignored_layers_entry_in_vllms_own_spelling_excludes_the_layer(tmp_path):
    """vLLM maps ignored_layers through the class's rename mapper (model_loader/utils.py:379): `layers.` gains
    `model.`, an entry already spelled `model.layers.1.attn.wq_b` stays as it is and names the layer too."""
    def edit(tensors):
        tensors.pop("layers.1.attn.wq_b.scale")
        tensors["layers.1.attn.wq_b.weight"] = tensors["layers.1.attn.wq_b.weight"].to(torch.bfloat16)
    folder = dsv4_fp8_fixture.write(tmp_path / "dsv4", edit=edit)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["ignored_layers"] = ["model.layers.1.attn.wq_b"]
    (folder / "config.json").write_text(json.dumps(config))
    loaded = _load_hashed(folder)
    assert loaded["ok"] and loaded["methods"]["model.layers.1.attn.wq_b"]["method"] == "UnquantizedLinearMethod", loaded
    code, report = doctor(folder)
    assert code == 0, [f for f in report["findings"] if f["severity"] != "info"]
