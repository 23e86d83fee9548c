"""`--target sglang==X.Y.Z` (issue 28): SGLang's own rules, release by release, where they differ from vLLM's.

Layouts are the real fixtures (tools/real_fixture.py: published configs and tensor names, tiny sizes) with the
storage or the exclusion list of a published report (runtimes_beyond_vllm.md §5). The rules asserted are SGLang's
code (repair/targets/data/sglang-*.json name the wheel files): is_layer_skipped substring (<= 0.5.10) against
dotted-boundary (0.5.11), its fused-shard ValueError, is_layer_excluded's wildcards that leave a fused layer
quantized, the NextN / MTP drafts that drop modelopt_fp4, and MIXED_PRECISION read as w4afp8 before 0.5.23.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from repair.targets import profiles
from repair.targets.matchers import EXCLUSION_MATCHERS, KINDS
from tests.conftest import run_captured
from tools.real_fixture import REAL_MODELS, write_real_model

SGLANG = "sglang==0.5.23"
QKV_MIX = ("ValueError: Detected some but not all shards of model.layers.0.self_attn.qkv_proj are quantized. All shards "
           "of fused layers to have the same precision.")


def layout(root: Path, key: str, bf16: str | None = None, exclude: list[str] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """A real fixture, optionally with another BF16 storage pattern and another ModelOpt exclusion list."""
    model = REAL_MODELS[key] if bf16 is None else replace(REAL_MODELS[key], bf16=bf16)
    folder = write_real_model(root / f"{key}-{abs(hash((bf16, tuple(exclude or ()), drop)))}", key, model)
    if exclude is not None or drop:
        hf = json.loads((folder / "hf_quant_config.json").read_text())
        listed = hf["quantization"]["exclude_modules"] if exclude is None else exclude
        hf["quantization"]["exclude_modules"] = [e for e in listed if e not in drop]
        (folder / "hf_quant_config.json").write_text(json.dumps(hf))
    return folder


def doctor(capsys, folder: Path, target: str = SGLANG, *extra: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json", *extra)
    assert err == "" or code != 2, err
    return code, json.loads(out)


def errors(report: dict) -> dict[str, dict]:
    return {f["subject"]: f for f in report["findings"] if f["severity"] == "error"}


def test_target_resolves_the_newest_release_file_at_or_below_and_says_which():
    assert profiles.resolve("sglang==0.5.23").profile.rules.source == "sglang-0.5.23.json"
    later = profiles.resolve("sglang==0.5.30")
    assert later.profile.rules.source == "sglang-0.5.23.json" and "newest shipped at or below 0.5.30" in later.label
    assert profiles.resolve("sglang==0.5.10.post1").profile.rules.source == "sglang-0.5.10.json"


def test_a_release_older_than_every_rules_file_is_one_line_and_exit_2(capsys, tmp_path):
    folder = layout(tmp_path, "qwen3-32b")
    code, out, err = run_captured(capsys, "doctor", folder, "--target", "sglang==0.5.8")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1 and "0.5.9" in err


def test_healthy_real_fixtures_are_clean_and_every_stored_layer_has_a_scheme(capsys, tmp_path):
    for key in ("llama-3.3-70b", "qwen3-32b", "qwen3-30b-a3b", "deepseek-v3-0324", "gemma-4-31b-it"):
        code, report = doctor(capsys, layout(tmp_path, key))
        assert code == 0 and errors(report) == {}, key
        assert report["schemes"] and set(report["schemes"].values()) <= {"nvfp4", "bf16"}, key
    assert report["schemes"]["model.language_model.layers.1.mlp.gate_proj"] == "nvfp4"


def test_mlp_gate_entry_swallows_gate_up_proj_up_to_0_5_10_not_from_0_5_11(capsys, tmp_path):
    """qwen3-30b-a3b's router entries (`model.layers.N.mlp.gate`) on a dense Qwen3: is_layer_skipped's substring
    match (<= 0.5.10) builds `mlp.gate_up_proj` BF16, and its packed shards then fail the merged-column loader;
    0.5.11's dotted-boundary match does not (SGLang's own comment: the Qwen3.6-FP8 configs)."""
    folder = layout(tmp_path, "qwen3-32b", exclude=["lm_head", "model.layers.0.mlp.gate"])
    code, old = doctor(capsys, folder, "sglang==0.5.10")
    assert code == 1 and old["schemes"]["model.layers.0.mlp.gate_proj"] == "bf16"
    assert errors(old)["model.layers.0.mlp.gate_proj"]["runtime_error"] == "AssertionError"
    code, new = doctor(capsys, folder, "sglang==0.5.11")
    assert code == 0 and new["schemes"]["model.layers.0.mlp.gate_proj"] == "nvfp4"


def test_shards_listed_by_exact_name_raise_sglangs_fused_error_from_0_5_11(capsys, tmp_path):
    """Only q_proj listed (and stored BF16): 0.5.11+ fall back to q/k/v for qkv_proj (Qwen3 declares no packed
    mapping) and raise SGLang's ValueError; 0.5.10 treats qkv_proj as one unfused name, builds it NVFP4, and the
    BF16 q_proj fails the QKV loader's shape check (sglang PR #18189: the 235B's per-layer q/k/v names)."""
    folder = layout(tmp_path, "qwen3-32b", bf16=r"^model\.layers\.0\.self_attn\.q_proj$|^lm_head$",
                    exclude=["lm_head", "model.layers.0.self_attn.q_proj"])
    code, new = doctor(capsys, folder, SGLANG, "--tp", "2")
    assert code == 1 and errors(new)["model.layers.0.self_attn.qkv_proj"]["runtime_error"] == QKV_MIX
    assert [(s["rank"], s["error"]) for s in new["runtime_stops_at"]] == [(0, QKV_MIX), (1, QKV_MIX)]
    code, old = doctor(capsys, folder, "sglang==0.5.10")
    assert code == 1 and old["schemes"]["model.layers.0.self_attn.q_proj"] == "nvfp4"
    assert errors(old)["model.layers.0.self_attn.q_proj"]["runtime_error"] == (
        "AssertionError: param_data.shape=torch.Size([64, 32]), loaded_weight.shape=torch.Size([64, 64])")


def test_a_wildcard_shard_exclusion_builds_the_fused_layer_quantized_and_fails_per_rank(capsys, tmp_path):
    """sglang#36596 (GLM-5.3 NVFP4): `*.self_attn.q_proj` does not name the fused qkv_proj, so SGLang builds it
    NVFP4 without raising, and the BF16 q_proj fails the QKV v2 loader; the text per rank is SGLang's (probed)."""
    folder = layout(tmp_path, "qwen3-32b", bf16=r"\.self_attn\.q_proj$|^lm_head$", exclude=["lm_head", "*.self_attn.q_proj"])
    code, report = doctor(capsys, folder, SGLANG, "--tp", "2")
    assert code == 1 and report["schemes"]["model.layers.0.self_attn.q_proj"] == "nvfp4"
    assert "model.layers.0.self_attn.qkv_proj" not in errors(report)
    ranks = {s["rank"]: s["error"] for s in report["runtime_stops_at"]}
    assert ranks == {r: "AssertionError: param_data.shape=torch.Size([32, 32]), loaded_weight.shape=torch.Size([32, 64])"
                     for r in (0, 1)}


def test_nextn_draft_drops_modelopt_fp4_so_an_unlisted_bf16_mtp_layer_loads(capsys, tmp_path):
    """sglang PR #16581 / Model-Optimizer#750: the export does not exclude the MTP layer although it is BF16.
    SGLang's DeepSeek NextN draft drops modelopt_fp4 (models/deepseek_nextn.py), so it builds layer 61 BF16 and
    loads it; vLLM follows the exclusion list and does not."""
    folder = layout(tmp_path, "deepseek-v3-0324", drop=("model.layers.61*",))
    code, report = doctor(capsys, folder)
    assert code == 0, errors(report)
    assert {s for n, s in report["schemes"].items() if n.startswith("model.layers.61.")} == {"bf16"}


def test_mixed_precision_before_0_5_23_is_read_as_w4afp8(capsys, tmp_path):
    from tools.real_fixture import write_qwen36

    folder = write_qwen36(tmp_path / "qwen36")
    code, report = doctor(capsys, folder, "sglang==0.5.10")
    assert code == 1 and any("w4afp8" in f["message"] for f in report["findings"])
    code, report = doctor(capsys, folder, "sglang==0.5.23")
    assert not any("w4afp8" in f["message"] for f in report["findings"])
    assert {s for n, s in report["schemes"].items() if n.startswith("mtp.")} == {"bf16"}  # qwen3_5_mtp.py


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10", "0.5.11", "0.5.23"])
def test_every_release_file_names_registered_matchers_and_its_source(release):
    rules = profiles.resolve(f"sglang=={release}").profile.rules
    assert rules.release == tuple(int(p) for p in release.split("."))
    doc = json.loads((Path(profiles.__file__).parent / "data" / f"sglang-{release}.json").read_text())
    assert {"runtime", "release", "source", "rules"} <= set(doc) and doc["source"]["sha256"]
    assert {"modelopt", "compressed-tensors", "quantized_layers"} <= set(doc["rules"]["matchers"])
    assert set(doc["rules"]["matchers"]) - set(KINDS) <= {"deepseek_v4_fp8"}  # 0.5.23: DeepSeek-V4's published fp8 form
    for kind in set(doc["rules"]["matchers"]) - {"quantized_layers"}:
        assert doc["rules"]["matchers"][kind] in EXCLUSION_MATCHERS, kind


def test_deepseek_q_lora_rank_adds_the_mla_fused_layer_sglang_0_5_23_refuses_when_split(capsys, tmp_path):
    """DeepseekV2ForCausalLM.__init__ adds fused_qkv_a_proj_with_mqa to the quant config's packed mapping when
    q_lora_rank is set (0.5.23; data `packed_when_config`): R1's list excludes one shard, so SGLang refuses at build."""
    folder = layout(tmp_path, "deepseek-r1")
    code, report = doctor(capsys, folder)
    wanted = ("ValueError: Detected some but not all shards of model.layers.0.self_attn.fused_qkv_a_proj_with_mqa are "
              "quantized.")
    assert code == 1 and any(f["code"] == "fused-shards" and wanted in json.dumps(f) for f in errors(report).values())
    config = json.loads((folder / "config.json").read_text())
    rules = profiles.resolve(SGLANG).profile.rules
    assert "fused_qkv_a_proj_with_mqa" in rules.building("DeepseekV3ForCausalLM", None, config).packed
    assert "fused_qkv_a_proj_with_mqa" not in rules.building("DeepseekV3ForCausalLM", None, {**config, "q_lora_rank": None}).packed


def test_eagle3_nested_config_json_exclusions_are_dropped_and_fc_is_a_plain_linear(capsys, tmp_path):
    """ModelOpt's EAGLE-3 draft: config.json's nested quantization_config gets quant_algo merged in at its top level
    (configs/model_config.py), so from_config's flat branch drops the nested exclude_modules and lm_head is built
    NVFP4; llama_eagle3.py builds fc as a plain torch.nn.Linear. The texts are what SGLang 0.5.23 raises (tier)."""
    from tools.layout_fixture import write_layout

    folder = tmp_path / "eagle3"
    write_layout(folder, "modelopt-eagle3-draft")
    code, report = doctor(capsys, folder)
    assert code == 1 and report["schemes"]["lm_head"] == "nvfp4" and report["schemes"]["fc"] == "bf16"
    found = errors(report)
    assert found["lm_head"]["runtime_error"] == ("RuntimeError: The size of tensor a (32) must match the size of "
                                                 "tensor b (64) at non-singleton dimension 1")
    assert found["fc"]["runtime_error"] == ("AssertionError: Attempted to load weight (torch.Size([64, 64])) into "
                                            "parameter (torch.Size([64, 128]))")


def test_a_target_list_is_never_read_as_its_first_target(capsys, tmp_path):
    """`vllm==0.32.0,sglang==0.5.23` once resolved to vLLM alone (the suffix swallowed the rest), so fix said
    "nothing to fix" for a checkpoint SGLang refuses: the output is repaired for SGLang too."""
    folder = write_real_model(tmp_path / "ct", "ct-llama-dense", REAL_MODELS["ct-llama-dense"])
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", "vllm==0.32.0,sglang==0.5.23")
    assert code == 0 and "nothing to fix" not in out + err, err
    assert run_captured(capsys, "doctor", tmp_path / "out", "--target", SGLANG, "--strict")[0] == 0


def test_eagle3_unread_list_is_not_called_unused_and_fix_writes_it_where_sglang_reads(capsys, tmp_path):
    """The nested list SGLang never reads still names lm_head (no false unused-exclusion, which made fix's own check
    of its output fail with exit 3); fix writes the list at the block's top level too, where SGLang reads it."""
    from tools.layout_fixture import write_layout

    folder = tmp_path / "eagle3"
    write_layout(folder, "modelopt-eagle3-draft")
    code, report = doctor(capsys, folder)
    assert not any(f["code"] == "unused-exclusion" and f["subject"] == "lm_head" for f in report["findings"])
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", SGLANG)
    assert code == 0, err
    assert "lm_head" in json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["ignore"]
    assert run_captured(capsys, "doctor", tmp_path / "out", "--target", SGLANG, "--strict")[0] == 0


NULL_LIST = "ValueError: NVFP4 quantization requires group_size and exclude_modules specified in the quantization config"


def _null_list(folder: Path, file: str, path: tuple[str, ...], key: str) -> Path:
    doc = json.loads((folder / file).read_text())
    section = doc
    for part in path:
        section = section[part]
    section[key] = None
    (folder / file).write_text(json.dumps(doc))
    return folder


NULL_LISTS = {  # the list SGLang's ModelOptFp4Config.from_config reads, written null (all seen refused in the tier)
    "nested-top-ignore": ("modelopt-eagle3-draft", "config.json", ("quantization_config",), "ignore"),
    "nested-top-modules_to_not_convert": ("modelopt-eagle3-draft", "config.json", ("quantization_config",), "modules_to_not_convert"),
    "flat-ignore": ("modelopt-glm4-moe", "config.json", ("quantization_config",), "ignore"),
    "hf-exclude_modules": ("qwen3-32b", "hf_quant_config.json", ("quantization",), "exclude_modules"),
}


def null_list_layout(root: Path, name: str) -> Path:
    from tools.layout_fixture import write_layout

    key, file, path, field = NULL_LISTS[name]
    folder = root / name
    write_layout(folder, key) if key.startswith("modelopt-") else write_real_model(folder, key)
    return _null_list(folder, file, path, field)


@pytest.mark.parametrize("name", sorted(NULL_LISTS))
def test_a_null_exclusion_list_is_sglangs_config_error_and_fix_writes_a_list(capsys, tmp_path, name):
    """ModelOptFp4Config.from_config (modelopt_quant.py 0.5.23, the tier checks) raises while reading the config when the
    list it reads is null (`"ignore": null` beside a nested block, in the flat form, or hf_quant_config.json's
    exclude_modules): doctor says SGLang's error, where it stops (before any weight), and no load error of a layer
    it never builds; fix writes a list there and the output is clean for SGLang."""
    folder = null_list_layout(tmp_path, name)
    code, report = doctor(capsys, folder)
    assert code == 1 and [s["error"] for s in report["runtime_stops_at"]] == [NULL_LIST], report["runtime_stops_at"]
    found = [f for f in report["findings"] if f["runtime_error"] == NULL_LIST]
    assert len(found) == 1 and NULL_LISTS[name][3] in found[0]["message"], found
    assert not [f for f in report["findings"] if f["code"] == "load-error"], report["findings"]
    assert not any(f["runtime_error"] == NULL_LIST for f in doctor(capsys, folder, "vllm==0.32.0")[1]["findings"])
    code, _, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", SGLANG)
    assert code == 0, err
    assert run_captured(capsys, "doctor", tmp_path / "out", "--target", SGLANG, "--strict")[0] == 0



@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
@pytest.mark.parametrize("model_type", ["deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa"])
def test_an_absent_packed_when_key_is_the_config_class_default(release, model_type):
    """SGLang's DeepseekV2ForCausalLM adds fused_qkv_a_proj_with_mqa where `hasattr(config, "q_lora_rank") and
    config.q_lora_rank is not None` (0.5.23 models/deepseek_v2.py:3261-3263), asked of transformers' config class: a
    config.json without q_lora_rank gets the class default, which transformers' classes for these model types set
    (DeepseekV2Config 1536, GlmMoeDsaConfig 2048), so the fusion is built; only a config.json writing null
    (DeepSeek-V2-Lite) builds the shards alone. (The sglang venv's transformers has no sarvam_mla, whose default is null.)"""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    rules = profiles.resolve(f"sglang=={release}").profile.rules
    architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]
    [(key, added)] = rules.packed_when[architecture].items()
    assert getattr(CONFIG_MAPPING[model_type](), key) is not None
    config = {"architectures": [architecture], "model_type": model_type}
    assert set(added) <= set(rules.building(architecture, None, config).packed), (architecture, key)
    assert not set(added) & set(rules.building(architecture, None, {**config, key: None}).packed), (architecture, key)
