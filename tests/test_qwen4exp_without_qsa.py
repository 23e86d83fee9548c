"""Qwen4Exp's row follows its config (#26 wave 2 attack): vLLM 0.32 builds QSA attention only when indexer_n_heads is
set (qwen4_exp/nvidia/model.py:243), and QSA's fused q/k/v/indexer linear drops ModelOpt FP4 (model.py:104); without
it, Qwen3NextAttention's qkv_proj takes the quant config. The profile records both builds (the generator builds the
model again with the indexer_* fields null: `without`), so a checkpoint without QSA whose q/k/v are NVFP4 is healthy,
and one with QSA is not. vLLM 0.32 itself judges the same checkpoints in tests/vllm/test_attack_qwen4exp.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair import arch
from repair.arch.configured import as_configured
from repair.doctor.missing import missing_modules
from tests.conftest import run_captured
from tests.test_doctor_load_refused import nvfp4
from tests.test_doctor_missing import drop_recipe

INDEXER = {"indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 16, "indexer_budget": 2048,
           "indexer_compress_ratio": 4}
ATTN = "model.layers.3.self_attn"
INDEXER_NORMS = ("q_layernorm", "k_layernorm")
QKV = [f"{ATTN}.{p}_proj" for p in "qkv"]


def write(folder: Path, indexer: dict, excluded: tuple[str, ...] = ()) -> Path:
    """One Qwen4Exp full-attention layer: q/k/v/o NVFP4 (a quantize-every-linear ModelOpt export), the indexer's
    projection BF16 where the config has one; `excluded`: entries added to the list, q/k/v then stored BF16."""
    folder.mkdir(parents=True)
    tensors = {"model.embed_tokens.weight": torch.zeros(256, 64, dtype=torch.bfloat16)}
    for module, rows in ((QKV[0], 128), (QKV[1], 16), (QKV[2], 16), (f"{ATTN}.o_proj", 64)):
        plain = excluded and module in QKV
        tensors |= {f"{module}.weight": torch.zeros(rows, 64, dtype=torch.bfloat16)} if plain else nvfp4(module, rows, 64)
    if indexer:
        tensors |= {f"{ATTN}.indexer.index_qk_proj.weight": torch.zeros(80, 64, dtype=torch.bfloat16),
                    **{f"{ATTN}.indexer.{n}.weight": torch.ones(16, dtype=torch.bfloat16) for n in INDEXER_NORMS}}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = {"architectures": ["Qwen4ExpForCausalLM"], "model_type": "qwen4_exp_text", "hidden_size": 64,
              "num_hidden_layers": 4, "vocab_size": 256, **indexer}
    (folder / "config.json").write_text(json.dumps(config))
    quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
             "exclude_modules": ["lm_head", *excluded] + ([f"{ATTN}.indexer.index_qk_proj"] if indexer else [])}
    (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.33.0"},
                                                             "quantization": quant}))
    return folder


def contradicted(capsys, folder: Path, code: str = "config-contradiction") -> set[str]:
    return {f["subject"] for f in findings(capsys, folder) if f["code"] == code}


def findings(capsys, folder: Path) -> list[dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", "vllm==0.32.0", "--json")
    assert code in (0, 1), err
    return json.loads(out)["findings"]


def test_without_qsa_packed_qkv_is_what_vllm_builds(tmp_path, capsys):
    assert contradicted(capsys, write(tmp_path / "plain", {})) == set()


@pytest.mark.parametrize("nulls", [False, True])
def test_with_qsa_packed_qkv_is_an_error_and_null_fields_mean_no_qsa(tmp_path, capsys, nulls):
    if nulls:  # the fields present but null, as transformers' config writes them when unset: no QSA either
        folder = write(tmp_path / "nulls", {})
        config = json.loads((folder / "config.json").read_text()) | dict.fromkeys(INDEXER)
        (folder / "config.json").write_text(json.dumps(config))
        assert contradicted(capsys, folder) == set()
    else:
        assert contradicted(capsys, write(tmp_path / "qsa", INDEXER)) == set(QKV)


def test_the_row_differs_only_where_vllms_two_builds_do():
    qsa = arch.architecture({"architectures": ["Qwen4ExpForCausalLM"], **INDEXER})
    plain = arch.architecture({"architectures": ["Qwen4ExpForCausalLM"], "text_config": {"indexer_n_heads": None}})
    assert qsa.fused_layers == plain.fused_layers
    assert {r.pattern for r in qsa.unquantized_roles} - {r.pattern for r in plain.unquantized_roles}



@pytest.mark.parametrize("config,qsa", [
    ({"text_config": {"indexer_n_heads": 4}}, True),  # vLLM reads hf_text_config: a VLM's text part
    ({"indexer_n_heads": 0}, True),  # vLLM asks `is not None`: 0 is QSA (its indexer then refuses; not ours to say)
])
def test_the_config_part_vllm_reads_decides(config, qsa):
    row = arch.architecture({"architectures": ["Qwen4ExpForCausalLM"], **config})
    assert any(r.covers(QKV[0], "modelopt-nvfp4", "NVFP4") for r in row.unquantized_roles) == qsa, config


@pytest.mark.parametrize("text_config", ["hostile", ["x"], None, 7])
def test_a_text_config_that_is_no_object_reads_the_config_itself(text_config):
    config = {"architectures": ["Qwen4ExpForCausalLM"], "text_config": text_config, "indexer_n_heads": 4}
    assert any(r.covers(QKV[0], "modelopt-nvfp4", "NVFP4") for r in arch.architecture(config).unquantized_roles)


def test_without_qsa_excluding_q_k_v_by_name_is_refused_as_vllm_asks_the_indexer_shard(tmp_path, capsys):
    """vLLM 0.32's is_layer_skipped asks every shard of the class's packed_modules_mapping (the profile's `fused`:
    q, k, v and indexer.index_qk_proj, model.py:703), also in Qwen3NextAttention's qkv_proj without QSA: the indexer
    shard, neither stored nor listed, disagrees with the three listed ones (tier: test_attack_qwen4exp.py)."""
    [qkv] = [f for f in findings(capsys, write(tmp_path / "plain", {}, tuple(QKV))) if f["code"] == "fused-shards"]
    assert qkv["subject"] == f"{ATTN}.qkv_proj" and qkv["severity"] == "error", qkv
    assert "indexer.index_qk_proj" in qkv["message"] and "Detected some but not all shards" in qkv["runtime_error"], qkv


@pytest.mark.parametrize("listed", [(*QKV, f"{ATTN}.qkv_proj"), (f"{ATTN}.*",), (f"{ATTN}.qkv_proj",)])
def test_without_qsa_a_list_vllm_reads_as_the_whole_fused_layer_is_no_refusal(tmp_path, capsys, listed):
    """vLLM first tests the fused name itself (quant_utils.py:662), and a wildcard names no shard exactly."""
    assert contradicted(capsys, write(tmp_path / "plain", {}, listed), "fused-shards") == set()


@pytest.mark.parametrize("left_out", ["index_qk_proj", "q_layernorm", "all"])
def test_with_qsa_the_indexer_vllm_loads_is_expected(tmp_path, capsys, left_out):
    """vLLM 0.32's QSA build loads the indexer's projection (into qkv_proj) and norms, which its build without QSA has no
    parameter for (the profile's `without.loads_only_with`): a QSA checkpoint without them runs on uninitialised memory,
    or stops where vLLM tracks weights (tier: test_attack_qwen4exp.py's qsa-without-indexer)."""
    folder = write(tmp_path / "qsa", INDEXER)
    indexer = {f"{ATTN}.indexer.{n}" for n in ("index_qk_proj", *INDEXER_NORMS)}
    lost = indexer if left_out == "all" else {f"{ATTN}.indexer.{left_out}"}
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k.rpartition(".")[0] not in lost}, folder / "model.safetensors")
    missing = [f for f in findings(capsys, folder) if f["code"] == "missing-module"]
    assert {f["subject"] for f in missing} == lost and all(f["severity"] == "error" for f in missing), missing
    assert all("indexer_n_heads" in f["message"] and "enable_weights_track" in f["message"] for f in missing), missing


def test_without_qsa_no_indexer_is_expected_and_with_it_stored_nothing_is_missing(tmp_path, capsys):
    assert contradicted(capsys, write(tmp_path / "plain", {}), "missing-module") == set()
    assert contradicted(capsys, write(tmp_path / "qsa", INDEXER), "missing-module") == set()


def test_hostile_layer_names_expect_nothing_and_never_crash():
    """Layer "numbers" that are no ASCII number of at most 6 digits name no layer (and int() is never asked of them)."""
    row = arch.architecture({"architectures": ["Qwen4ExpForCausalLM"], **INDEXER})
    names = [f"model.layers.{n}.self_attn.q_proj.weight" for n in ("²", "1234567", "-1", "", "0x1", "٣")]
    assert missing_modules(names, {}, row.name, {}, frozenset(), row.required_modules) == {}
    assert set(missing_modules(["model.layers.007.self_attn.q_proj.weight"], {}, row.name, {}, frozenset(),
                               row.required_modules)) == {f"model.layers.007.self_attn.indexer.{n}" for n in
                                                          ("index_qk_proj", *INDEXER_NORMS)}


def test_a_drop_rule_removing_the_qsa_indexer_is_refused_before_writing(tmp_path, capsys):
    """The output would lack a module the QSA build loads (doctor: missing-module), so its self-check would fail (exit
    3, our bug): fix refuses the drop rule in one line instead, exit 2, nothing written."""
    folder = write(tmp_path / "qsa", INDEXER)
    norm = f"{ATTN}.indexer.q_layernorm"
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--recipe",
                                  drop_recipe(tmp_path, "vllm==0.32.0", norm), "--quiet")
    assert code == 2 and err.count("\n") == 1 and norm in err and "drop rule" in err, (code, err)
    assert not (tmp_path / "out").exists()


INDEXER_REFUSED = "ValueError: There is no module or parameter named 'layers.3.self_attn.indexer' in Qwen4ExpModel."


def doctor_json(capsys, folder: Path, target: str = "vllm==0.32.0") -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


def test_without_qsa_a_stored_indexer_is_refused_in_vllms_words(tmp_path, capsys):
    """The build without QSA has no parameter for the indexer: its load_weights raises on the first indexer tensor
    (the profile's `without.refused_only_with`, recorded from that build's own load_weights), on every rank."""
    folder = without_qsa_stored_indexer(tmp_path / "stored")  # the indexer unlisted: no layer is refused while built
    code, report = doctor_json(capsys, folder)
    [f] = [f for f in report["findings"] if f["code"] == "unexpected-tensor"]
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == INDEXER_REFUSED, f
    assert f["subject"].startswith(f"{ATTN}.indexer.") and "indexer_n_heads" in f["message"], f
    assert [s["error"] for s in report["runtime_stops_at"]] == [INDEXER_REFUSED], report["runtime_stops_at"]
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", "vllm==0.32.0", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "unexpected-tensor" in err, (code, err)
    assert not (tmp_path / "out").exists()


def test_with_qsa_the_stored_indexer_is_what_vllm_loads(tmp_path, capsys):
    code, report = doctor_json(capsys, write(tmp_path / "qsa", INDEXER))
    assert not [f for f in report["findings"] if f["code"] in ("unexpected-tensor", "config-refused")], report["findings"]


@pytest.mark.parametrize("nulled", sorted(INDEXER))
def test_a_qsa_config_with_one_field_null_is_refused_in_its_config_class_words(tmp_path, capsys, nulled):
    """transformers' Qwen4ExpConfig, which vLLM runs while reading config.json, refuses a QSA config missing one of
    its fields (the profile's `without.partly_null_refused`, recorded from vLLM's own config loading), before any
    layer is built: on every rank, and nothing about layers is the stop."""
    folder = write(tmp_path / nulled, {**INDEXER, nulled: None})
    code, report = doctor_json(capsys, folder)
    [f] = [f for f in report["findings"] if f["code"] == "config-refused"]
    assert code == 1 and f["severity"] == "error" and f["subject"] == nulled, f
    assert f["runtime_error"].endswith(f"ValueError: QSA config is missing required fields: ['{nulled}'].")
    assert [s["error"] for s in report["runtime_stops_at"]] == [f["runtime_error"]], report["runtime_stops_at"]


def test_a_qsa_config_with_several_fields_null_is_refused_without_a_made_up_text(tmp_path, capsys):
    """vLLM 0.32's words for these two null are recorded (the generator asks every subset): quoted. A profile that
    records single fields only (older data) still refuses two null, with no text made up for them."""
    folder = write(tmp_path / "two", {**INDEXER, "indexer_budget": None, "indexer_head_dim": None})
    code, report = doctor_json(capsys, folder)
    [f] = [f for f in report["findings"] if f["code"] == "config-refused"]
    assert code == 1 and "indexer_head_dim, indexer_budget" in f["message"], f
    assert f["runtime_error"].endswith("missing required fields: ['indexer_head_dim', 'indexer_budget'].")
    singles = {"fields": list(INDEXER), "modules": {}, "partly_null_refused": {k: f"E: {k}" for k in INDEXER}}
    said = as_configured({"modules": {}, "without": singles}, {**INDEXER, "indexer_budget": None, "indexer_head_dim": None})
    assert said["config_refused"]["error"] is None and said["config_refused"]["fields"] == ["indexer_head_dim", "indexer_budget"]


def test_other_runtimes_are_not_told_vllms_facts(tmp_path, capsys):
    folder = write(tmp_path / "one", {**INDEXER, "indexer_budget": None})
    code, report = doctor_json(capsys, folder, "sglang==0.5.23")
    assert not [f for f in report["findings"] if f["code"] in ("unexpected-tensor", "config-refused")], report["findings"]


def without_qsa_stored_indexer(folder: Path, listed: bool = False) -> Path:
    """Every indexer_* field null over a checkpoint that stores the indexer; `listed`: its projection stays in the
    exclusions, which vLLM asks as the fused qkv_proj's fourth shard while building the layer."""
    write(folder, INDEXER)
    config = json.loads((folder / "config.json").read_text()) | dict.fromkeys(INDEXER)
    (folder / "config.json").write_text(json.dumps(config))
    if not listed:
        quant = json.loads((folder / "hf_quant_config.json").read_text())
        quant["quantization"]["exclude_modules"] = ["lm_head"]
        (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    return folder


def test_vllm_stops_at_the_first_indexer_tensor_in_its_own_load_order(tmp_path, capsys):
    """vLLM 0.32 reads the shards in natural order (weight_utils.py safetensors_weights_iterator: model-2 before
    model-10) and each shard's names sorted; its load_weights raises on the first indexer tensor it meets: layer 3's
    here, in model-2, though layer 11's name sorts first and its shard's name sorts first as text."""
    folder = without_qsa_stored_indexer(tmp_path / "shards")
    config = json.loads((folder / "config.json").read_text()) | {"num_hidden_layers": 12}
    (folder / "config.json").write_text(json.dumps(config))
    tensors = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    later = {k.replace(".layers.3.", ".layers.11."): v for k, v in tensors.items() if ".layers.3." in k}
    shards = {"model-2.safetensors": tensors, "model-10.safetensors": later}
    for shard, part in shards.items():
        save_file(part, folder / shard, metadata={"format": "pt"})
    weight_map = {name: shard for shard, part in shards.items() for name in part}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    code, report = doctor_json(capsys, folder)
    assert [s["error"] for s in report["runtime_stops_at"]] == [INDEXER_REFUSED], report["runtime_stops_at"]
    assert report["runtime_stops_at"][0]["tensor"].startswith(f"{ATTN}.indexer."), report["runtime_stops_at"]


def test_a_layer_vllm_refuses_while_building_stops_it_before_the_indexer_is_read(tmp_path, capsys):
    """The indexer's projection still listed: vLLM asks it as qkv_proj's fourth shard while building the layer and
    refuses the model there ("Detected some but not all shards"), before load_weights meets the stored indexer
    (tier: test_attack_qwen4exp.py's no-qsa-packed-qkv-with-indexer)."""
    code, report = doctor_json(capsys, without_qsa_stored_indexer(tmp_path / "listed", listed=True))
    assert {f["code"] for f in report["findings"]} >= {"unexpected-tensor", "fused-shards"}, report["findings"]
    [stop] = report["runtime_stops_at"]
    assert stop["error"].startswith("Detected some but not all shards") and stop["tensor"] == f"{ATTN}.qkv_proj", stop


@pytest.mark.parametrize("listed", [False, True])
def test_a_recipe_dropping_the_stored_indexer_settles_it(tmp_path, capsys, listed):
    """The fix doctor advises for a config without QSA (remove the indexer's tensors), written as a drop rule under
    the target: fix writes it, and the output loads in the build without QSA (its projection's exclusion entry, a
    ModelOpt QSA export's, goes with it: vLLM would ask it as qkv_proj's fourth shard). fix --target alone does not
    drop them: the fields may be what is wrong (nulled by mistake in a QSA model), and only the user knows."""
    folder = without_qsa_stored_indexer(tmp_path / "drop", listed)
    indexer = [f"{ATTN}.indexer.{n}" for n in ("index_qk_proj", *INDEXER_NORMS)]
    recipe = tmp_path / "drop.toml"
    recipe.write_text(f'name = "drop"\ntarget = "vllm==0.32.0"\n[[rules]]\naction = "drop"\nmodules = {json.dumps(indexer)}\n')
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--recipe", recipe, "--quiet")
    assert code == 0, (code, err)
    code, report = doctor_json(capsys, tmp_path / "out")
    assert code == 0 and not [f for f in report["findings"] if f["severity"] == "error"], report["findings"]
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "auto", "--target", "vllm==0.32.0", "--quiet")
    assert code == 2 and "unexpected-tensor" in err and not (tmp_path / "auto").exists(), (code, err)


@pytest.mark.parametrize("stored", ["indexer.weights_proj.weight", "indexer.index_qk_proj.extra.weight", "indexer.scale"])
def test_any_tensor_under_the_module_vllm_has_no_parameter_for_is_refused(tmp_path, capsys, stored):
    """vLLM's weights loader raises on the module it names ('layers.N.self_attn.indexer'), whatever tensor below it
    is stored: not only the three modules transformers' QSA export holds (tier: test_attack_qwen4exp.py)."""
    folder = write(tmp_path / "extra", {})
    tensors = load_file(folder / "model.safetensors") | {f"{ATTN}.{stored}": torch.ones(16, dtype=torch.bfloat16)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    code, report = doctor_json(capsys, folder)
    assert [s["error"] for s in report["runtime_stops_at"]] == [INDEXER_REFUSED], report
    [f] = [f for f in report["findings"] if f["code"] == "unexpected-tensor"]
    assert code == 1 and f["subject"] == f"{ATTN}.{stored}".rpartition(".")[0], f


@pytest.mark.parametrize("layer", ["٣", "3x", "03a"])
def test_a_layer_number_that_is_no_ascii_number_is_not_read_as_one(tmp_path, capsys, layer):
    folder = write(tmp_path / "odd", {})
    tensors = load_file(folder / "model.safetensors") | {f"model.layers.{layer}.self_attn.indexer.index_qk_proj.weight": torch.ones(1)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    code, report = doctor_json(capsys, folder)
    assert not [f for f in report["findings"] if f["code"] == "unexpected-tensor"], report["findings"]
