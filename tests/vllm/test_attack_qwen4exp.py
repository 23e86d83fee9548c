"""Qwen4Exp checkpoints beside the tier's healthy QSA export (#26 wave 2 attack): stored names with and without the
indexer, and a config without QSA. vLLM 0.32 judges each (tools/vllm_load.py, its own loader on CPU, the FlashAttention
stand-in never called); doctor --target vllm==0.32.0 must exit 0 exactly when vLLM loads it.

The profile records vLLM's QSA build (qwen4_exp/nvidia/model.py:243: `indexer_n_heads` set) and, as `without`, the
build with the indexer_* fields null (Qwen3NextAttention, whose fused qkv_proj takes the quant config): a checkpoint
without QSA whose q/k/v are NVFP4 loads, and doctor says so. Without QSA, qkv_proj keeps the class's
packed_modules_mapping (q, k, v and indexer.index_qk_proj, model.py:703), so excluding q/k/v by name makes vLLM 0.32
refuse the model ("Detected some but not all shards ... are quantized": the indexer shard, which such a checkpoint has
not, is not excluded); doctor asks the whole mapping the profile records for a layer built quantized (one that asks
its quant config), and says so; listing the fused name too loads (vLLM tests it first, quant_utils.py:662).
With QSA but the indexer's tensors left out of the checkpoint, vLLM (tracking weights) stops on its norms never
initialised; the profile records the modules only the QSA build loads (`without.loads_only_with`), and doctor calls
each one missing. A config without QSA over a checkpoint that still stores the indexer: the build without QSA raises
on it (`without.refused_only_with`); a config with one indexer_* field alone null: transformers' config class refuses
it before vLLM builds anything (`without.partly_null_refused`), both recorded from vLLM's own code."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
ARCH = "Qwen4ExpForCausalLM"


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    [line] = in_vllm("vllm_arch_check.py", tmp_path_factory.mktemp("qwen4exp"), ARCH)
    assert line["ok"] and line["healthy_load"]["ok"] and line["stand_in_calls"] == [], line
    return Path(line["healthy"])


def variant(healthy: Path, folder: Path, qsa: bool, indexer: bool, packed_qkv: bool, fused_named: bool = False,
            nulled: str = "", values: dict | None = None) -> Path:
    """The healthy export with the config's indexer_* null (qsa=False), the indexer's tensors and exclusions left out
    (indexer=False), q/k/v stored NVFP4 and not excluded (packed_qkv, one weight_scale_2 for the fused three), and the
    fused `self_attn.qkv_proj` of each layer storing q/k/v listed too (fused_named); `nulled`: only that field null
    (several: comma-separated); `values`: config fields set to these values."""
    shutil.copytree(healthy, folder)
    tensors = {k: v for k, v in load_file(folder / "model.safetensors").items() if indexer or ".indexer." not in k}
    qkv = sorted(n[: -len(".weight")] for n in tensors if n.endswith(("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight")))
    if packed_qkv:
        scale_2 = max(nvfp4.global_scale(tensors[f"{m}.weight"]) for m in qkv)
        for m in qkv:
            packed, scale, _ = nvfp4.quantize(tensors[f"{m}.weight"], scale_2)
            tensors |= {f"{m}.weight": packed, f"{m}.weight_scale": scale, f"{m}.weight_scale_2": scale_2.clone(),
                        f"{m}.input_scale": torch.tensor(0.02)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config |= {} if qsa else {k: None for k in config if k.startswith("indexer_") and (k in nulled.split(",") or not nulled)}
    config |= values or {}
    (folder / "config.json").write_text(json.dumps(config, indent=1))
    quant = json.loads((folder / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] = [e for e in quant["quantization"]["exclude_modules"]
                                                if (indexer or ".indexer." not in e) and not (packed_qkv and e in qkv)]
    quant["quantization"]["exclude_modules"] += sorted({f"{m.rpartition('.')[0]}.qkv_proj" for m in qkv}) if fused_named else []
    (folder / "hf_quant_config.json").write_text(json.dumps(quant, indent=1))
    return folder


CASES = {  # name -> (qsa, indexer, packed_qkv[, fused_named]), whether vLLM 0.32 loads it (this test asserts it again)
    "no-qsa-packed-qkv": ((False, False, True), True),
    "no-qsa-excluded-qkv": ((False, False, False), False),  # is_layer_skipped asks the indexer's shard too
    "no-qsa-excluded-qkv-fused-named": ((False, False, False, True), True),  # the fused name is tested first
    "qsa-without-indexer": ((True, False, False), False),  # the indexer's norms are never initialised
    "no-qsa-packed-qkv-with-indexer": ((False, True, True), False),  # the listed indexer shard disagrees with q/k/v
    "no-qsa-excluded-qkv-with-indexer": ((False, True, False), False),  # no parameter for the indexer: load_weights raises
    # only indexer_n_heads null, the others set: transformers' config refuses it ("QSA config is missing required
    # fields", configuration_qwen4_exp.py:217), so vLLM never reaches its own indexer_n_heads test (model.py:243)
    "n-heads-null-packed-qkv": ((False, False, True, False, "indexer_n_heads"), False),
    # two null, and values set that transformers' validation refuses (configuration_qwen4_exp.py:214-219): each in the
    # words the profile records (`without.partly_null_refused` for the subset, `without.value_refused`)
    "budget-and-head-dim-null": ((False, True, False, False, "indexer_budget,indexer_head_dim"), False),
    "kv-heads-2": ((True, True, False, False, "", {"indexer_kv_heads": 2}), False),
    "n-heads-0": ((True, True, False, False, "", {"indexer_n_heads": 0}), False),
    "budget-not-a-multiple": ((True, True, False, False, "", {"indexer_budget": 2050}), False),
    "ratio-negative": ((True, True, False, False, "", {"indexer_compress_ratio": -4}), False),
}
LEFT: dict[str, str] = {}  # case -> why doctor still disagrees (strict xfail): none left


@pytest.mark.parametrize("case", sorted(CASES))
def test_doctor_agrees_with_vllm(healthy, case, tmp_path, capsys, request):
    form, loads = CASES[case]
    folder = variant(healthy, tmp_path / case, *form)
    loaded = in_vllm("vllm_load.py", folder, "--moe-emulation")[0]
    assert loaded["ok"] == loads and loaded["stand_in_calls"] == [], loaded
    if case in LEFT:
        request.applymarker(pytest.mark.xfail(strict=True, reason=LEFT[case]))
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", folder, "--json")
    assert code in (0, 1), err
    assert (code == 0) == loaded["ok"], f"{case}: doctor exits {code}, vLLM 0.32: {loaded.get('error')}\n{out[-1500:]}"
    if not loaded["ok"]:  # for vLLM's reason: its error text, or each weight it names left unfilled
        errors = [f for f in json.loads(out)["findings"] if f["severity"] == "error"]
        said = {f.get("runtime_error") for f in errors} | {f"{f['subject']}.weight" for f in errors if f["code"] == "missing-module"}
        if "not initialized" in loaded["error"]:
            assert set(re.findall(r"'([^']+)'", loaded["error"])) <= said, (loaded["error"], errors)
        else:  # and where doctor names the stop, it is where vLLM stopped (a layer refused while built: before any load)
            words = {loaded["error"], f"{loaded['error_type']}: {loaded['error']}", vllms_words(loaded)}
            assert {s for s in said if s and quoted(s, words)}, (loaded, errors)
            stops = json.loads(out)["runtime_stops_at"]
            assert all(quoted(s["error"], words) for s in stops), (loaded, stops)


def quoted(said: str, words: set[str]) -> bool:
    """doctor says vLLM's words: the whole, or up to the values its message lists (the profile records the part two
    probes' errors share: "QSA config values must be positive")."""
    return said in words or any(w.startswith(said) and w[len(said):].startswith(": ") for w in words)


def vllms_words(loaded: dict) -> str:
    """vLLM's error as doctor quotes it: `Type: message`, where a message lists a layer's parameters (a set, printed in
    no fixed order: "There is no module or parameter named ..."), up to that list."""
    return f"{loaded['error_type']}: {loaded['error'].split('. The available parameters')[0]}."


def test_a_drop_rule_removing_the_indexer_of_a_config_without_qsa_loads(healthy, tmp_path, capsys):
    """doctor's advice for a config without QSA over a stored indexer (unexpected-tensor), as a drop rule under the
    target: fix writes it (the indexer's exclusion entries go with it), and vLLM 0.32 loads the output."""
    folder = variant(healthy, tmp_path / "stored", False, True, True)
    recipe = tmp_path / "drop.toml"
    recipe.write_text('name = "drop"\ntarget = "vllm==0.32.0"\n[[rules]]\naction = "drop"\n'
                      'modules = ["re:.*\\\\.self_attn\\\\.indexer\\\\..*"]\n')
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, (code, err)
    loaded = in_vllm("vllm_load.py", tmp_path / "out", "--moe-emulation")[0]
    assert loaded["ok"] and loaded["stand_in_calls"] == [], loaded


def test_a_tensor_under_the_indexer_the_build_without_qsa_lacks_is_refused_in_vllms_words(healthy, tmp_path, capsys):
    """A config without QSA over a checkpoint storing one tensor under a layer's `self_attn.indexer` that is none of
    transformers' three indexer modules: vLLM raises on the module it has no parameter for, and doctor says so."""
    folder = variant(healthy, tmp_path / "extra", False, False, True)
    tensors = load_file(folder / "model.safetensors")
    attn = next(n for n in sorted(tensors) if n.endswith(".self_attn.o_proj.weight")).rpartition(".o_proj")[0]
    save_file(tensors | {f"{attn}.indexer.weights_proj.weight": torch.ones(4, 8, dtype=torch.bfloat16)},
              folder / "model.safetensors", metadata={"format": "pt"})
    loaded = in_vllm("vllm_load.py", folder, "--moe-emulation")[0]
    assert not loaded["ok"] and "There is no module or parameter named" in loaded["error"], loaded
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.32.0", folder, "--json")
    assert code == 1 and [s["error"] for s in json.loads(out)["runtime_stops_at"]] == [vllms_words(loaded)], (loaded, out[-1500:])
