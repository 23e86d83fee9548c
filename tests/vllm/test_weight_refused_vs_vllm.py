"""The profile's `weight_refused` (what a release's own load_weights raises on, fed one module or tensor at a time:
tools/vllm_load_facts.py placed_weights, tools/vllm_expert_refusals.py for a variant's stacked experts), read by doctor
as the error vLLM raises (arch/load_refusals.py, doctor/config_builds.py), judged by vLLM 0.32's own loader on the same
files. MiniCPM-MoE-8x2B's layout (tests/test_remote_config_rows.py minicpm_moe: every MLP as NVFP4 experts w1/w2/w3,
num_experts 2): vLLM 0.32's MiniCPMMoE holds its experts in BF16 ws / w2s parameters with no quant method
(minicpm.py:122-139) and raises on ModelOpt's first scale tensor it meets; doctor must name that error, and with the
experts stored BF16 say nothing of the kind while vLLM loads them.
"""

from __future__ import annotations

import json

import pytest

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
# what MiniCPM-MoE-8x2B's config.json sets beside a Llama-like config, read by minicpm.py (dim_model_base, scale_emb,
# scale_depth): the fixture's config class is Qwen3Config (no remote code here), which keeps unknown fields
MINICPM_FIELDS = {"dim_model_base": 256, "scale_emb": 12, "scale_depth": 1.4}


def doctor_report(capsys, folder) -> tuple[int, dict]:
    from tests.conftest import run_captured

    code, out, err = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0", "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from tests.test_remote_config_rows import minicpm_moe
    from tools.real_fixture import write_real_model

    root = tmp_path_factory.mktemp("minicpm")
    folder = minicpm_moe(write_real_model(root / "qwen3", "qwen3-32b"), root / "moe")
    config = json.loads((folder / "config.json").read_text())  # the fields minicpm.py reads beyond Qwen3Config's
    (folder / "config.json").write_text(json.dumps(dict(config, **MINICPM_FIELDS)))
    return folder


def test_doctor_names_the_error_vllm_raises_on_nvfp4_experts(capsys, moe):
    [loaded] = in_vllm("vllm_load.py", moe)
    assert not loaded["ok"] and loaded["error_type"] == "KeyError", loaded
    code, report = doctor_report(capsys, moe)
    said = f"{loaded['error_type']}: {loaded['error']}"
    assert code == 1 and [s["error"].partition(" (vllm/")[0] for s in report["runtime_stops_at"]] == [said], (said, report)
    assert said in {f.get("runtime_error", "").partition(" (vllm/")[0] for f in report["findings"]
                    if f["code"] == "unexpected-tensor"}, report["findings"]


def test_bf16_experts_load_and_doctor_reports_no_refusal(capsys, moe, tmp_path):
    """The same experts stored BF16 (each w1/w2/w3 its dequantized shape, no scales) and excluded: vLLM loads them into
    ws / w2s; doctor reports no unexpected tensor."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "bf16"
    shutil.copytree(moe, folder)
    tensors = load_file(folder / "model.safetensors")
    experts = sorted({n.rpartition(".")[0] for n in tensors if ".mlp.experts." in n})
    for module in experts:
        rows, packed = tensors[f"{module}.weight"].shape
        for leaf in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
            tensors.pop(f"{module}.{leaf}", None)
        tensors[f"{module}.weight"] = torch.zeros(rows, packed * 2, dtype=torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    quant = json.loads((folder / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] += experts
    (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    [loaded] = in_vllm("vllm_load.py", folder)
    assert loaded["ok"], loaded
    code, report = doctor_report(capsys, folder)
    assert not [f for f in report["findings"] if f["code"] == "unexpected-tensor"], report["findings"]


def test_refused_tensors_over_shards_name_the_shard_vllm_reads_first(capsys, moe, tmp_path):
    """The same files split in two shards, layer 1 in the one vLLM reads first (weight_utils.py _natural_sort_key):
    vLLM raises on layer 1's scale; doctor's first error is that one, not layer 0's (first by name)."""
    import shutil

    from safetensors.torch import load_file, save_file

    folder = tmp_path / "shards"
    shutil.copytree(moe, folder)
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    names = ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    first = {n: t for n, t in tensors.items() if n.startswith("model.layers.1.")}
    save_file(first, folder / names[0], metadata={"format": "pt"})
    save_file({n: t for n, t in tensors.items() if n not in first}, folder / names[1], metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {n: names[n not in first] for n in tensors}}))
    [loaded] = in_vllm("vllm_load.py", folder)
    assert not loaded["ok"] and "layers.1." in loaded["error"], loaded
    code, report = doctor_report(capsys, folder)
    said = f"{loaded['error_type']}: {loaded['error']}"
    assert code == 1 and [s["error"].partition(" (vllm/")[0] for s in report["runtime_stops_at"]] == [said], (said, report)
