"""A module that is not stored (#28): SGLang 0.5.23's load_weights has no missing-weights check, so a fused layer's
absent shard (Qwen3 without layer 0's k_proj: qkv_proj built from q, k, v) and an absent norm load without an error,
rank by rank at TP 2, the k rows of qkv_proj never written; doctor --target sglang==0.5.23 says exactly that (the
release's `missing_weights` data), and predicts no stop."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file, save_file

from tools.real_fixture import write_real_model

from .probe import TARGET, repair_json, requires_sglang, run_probe

pytestmark = [pytest.mark.sglang, requires_sglang]
DROPPED = {"k_proj": "model.layers.0.self_attn.k_proj", "k_norm": "model.layers.0.self_attn.k_norm"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("sglang_missing")
    out = {}
    for name, module in DROPPED.items():
        folder = write_real_model(root / name, "qwen3-32b")
        tensors = load_file(folder / "model.safetensors")
        save_file({k: v for k, v in tensors.items() if not k.startswith(module + ".")}, folder / "model.safetensors",
                  metadata={"format": "pt"})
        out[name] = folder
    return out


@pytest.mark.parametrize("rank", [0, 1])
def test_sglang_loads_without_the_module_as_doctor_says(folders, rank):
    lines = dict(zip(folders, run_probe("load", *folders.values(), "--tp-size", 2, "--tp-rank", rank)))
    assert lines["k_proj"]["ok"] and lines["k_norm"]["ok"], {n: line.get("error") for n, line in lines.items()}
    qkv = [t for t, shard in lines["k_proj"]["shard_ids"].items() if t.startswith("model.layers.0.self_attn.")]
    assert sorted(lines["k_proj"]["shard_ids"][t] for t in qkv if t.endswith(".weight")) == ["q", "v"]
    for name, module in DROPPED.items():
        code, report = repair_json("doctor", folders[name], "--target", TARGET, "--tp", 2)
        found = {f["subject"]: f for f in report["findings"] if f["code"] == "missing-module"}
        assert code == 1 and report["runtime_stops_at"] == [], report["runtime_stops_at"]
        assert "SGLang 0.5.23 does not check for unfilled weights" in found[module]["message"], found
