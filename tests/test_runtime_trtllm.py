"""`--target trtllm==X`: which layers TensorRT-LLM builds unquantized, release by release, on real configs.

TensorRT-LLM does not install here; each test names the source behaviour it reproduces (repository, path, commit;
tests/data/trtllm/PROVENANCE.md has the rule in words) and is built from the real config files in tests/data/real/.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.targets import profiles
from repair.targets.matchers import exclusion_matcher
from repair.targets.runtime_rules import DATA, LLAMA_FUSIONS
from repair.targets.sglang_match import Building
from tests.trtllm_helpers import doctor_json, edit_json, findings
from tools.real_fixture import write_real_model

REAL = Path(__file__).parent / "data" / "real"
RELEASES = ("1.0.0", "1.1.0", "1.3.0", "1.4.0")
LLAMA = Building(LLAMA_FUSIONS, {}, False)


def real_entries(folder: str) -> list[str]:
    return json.loads((REAL / folder / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]


def laguna_ignore() -> list[str]:
    return json.loads((REAL / "laguna-m.1-nvfp4" / "quantization_config.json").read_text())["ignore"]


def rule(release: str, entries: list[str]):
    """The rule the shipped data file of `release` names, from the registry, over `entries`."""
    target = profiles.resolve(f"trtllm=={release}")
    return exclusion_matcher(target.profile.rules.matchers["modelopt"])(tuple(entries), None, LLAMA)


# (entries, module name, excluded under 1.0, 1.1, 1.3, 1.4)
MATCHING = [
    # QuantConfig.is_module_excluded_from_quantization, tensorrt_llm/models/modeling_utils.py @ 01ea6d79: fnmatchcase
    # on the full name; DeepSeek-V3-0324's real `model.layers.61*` names the MTP layer itself and all under it
    (real_entries("deepseek-v3-0324-nvfp4"), "model.layers.61", (True, True, True, True)),
    (real_entries("deepseek-v3-0324-nvfp4"), "model.layers.61.self_attn.q_a_proj", (True, True, True, True)),
    (real_entries("deepseek-v3-0324-nvfp4"), "model.layers.21.self_attn.kv_b_proj", (True, True, True, True)),
    (real_entries("deepseek-v3-0324-nvfp4"), "model.layers.21.mlp.experts", (False, False, False, False)),
    # the same entry written `model.layers.61.*`: the parent only from the `.*`-parent branch (ruocheng-nv 6106504d
    # modeling_utils.py L313-315); its children under every version (fnmatch `*` crosses dots)
    (["model.layers.61.*"], "model.layers.61", (False, False, False, True)),
    (["model.layers.61.*"], "model.layers.61.mlp.experts", (True, True, True, True)),
    # Laguna-M.1's real compressed-tensors `re:` ignore entries: fnmatch patterns that never match before PR #13844
    # (the layers are then quantized, silently), re.fullmatch after it (QiJune 6174b2c quant_config.py)
    (laguna_ignore(), "model.layers.0.self_attn.q_proj", (False, False, True, True)),
    (laguna_ignore(), "model.layers.3.mlp.gate", (False, False, True, True)),
    (laguna_ignore(), "lm_head", (True, True, True, True)),
    # a parent listed without a glob (as ModelOpt also writes them): its children only with the ancestor walk
    (["model.layers.1"], "model.layers.1.self_attn.o_proj", (False, False, True, True)),
    # DeepSeek-V4-Flash's real wildcards (names without `model.`): `*.attn.*` needs a dotted child
    (real_entries("deepseek-v4-flash-nvfp4"), "layers.3.attn.wq_a", (True, True, True, True)),
    (real_entries("deepseek-v4-flash-nvfp4"), "mtp.0.ffn.experts", (True, True, True, True)),
    (real_entries("deepseek-v4-flash-nvfp4"), "layers.3.ffn.experts", (False, False, False, False)),
    # fnmatchcase: case-sensitive; `?` and `[..]` are globs, not regex
    (["LM_HEAD"], "lm_head", (False, False, False, False)),
    (["model.layers.[0-1].mlp.down_proj"], "model.layers.1.mlp.down_proj", (True, True, True, True)),
    (["model.layers.?.mlp.down_proj"], "model.layers.10.mlp.down_proj", (False, False, False, False)),
]


@pytest.mark.parametrize("entries,name,expected", MATCHING, ids=[f"{i}-{m[1]}" for i, m in enumerate(MATCHING)])
def test_exclusion_matching_per_release(entries, name, expected):
    assert tuple(rule(r, entries).excludes(name) for r in RELEASES) == expected


def test_fused_layer_any_shard_excluded_is_bf16_and_never_refused():
    """apply_quant_config_exclude_modules (tensorrt_llm/_torch/models/modeling_utils.py @ cb4c622c): the candidates of
    a FUSED_QKV_LINEAR module are its name and the name with qkv_proj -> q_proj/k_proj/v_proj; any excluded one makes
    the whole layer unquantized. At 1.0.0rc4 (@ 000a01de) only the fused name itself is asked. Never a refusal
    (vLLM and SGLang raise on listed shards that disagree)."""
    entries = real_entries("qwen3-32b-nvfp4") + ["model.layers.0.self_attn.q_proj"]
    assert [rule(r, entries).excludes("model.layers.0.self_attn.qkv_proj") for r in RELEASES] == [False, True, True, True]
    assert [rule(r, entries).excludes("model.layers.0.self_attn.k_proj") for r in RELEASES] == [False, True, True, True]
    assert all(rule(r, entries).fused_refusal("model.layers.0.self_attn.qkv_proj", ("q_proj", "k_proj", "v_proj")) is None
               for r in RELEASES)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return write_real_model(tmp_path_factory.mktemp("trt") / "qwen3-32b", "qwen3-32b")


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory) -> Path:
    return write_real_model(tmp_path_factory.mktemp("trt") / "dsv3", "deepseek-v3-0324")


@pytest.mark.parametrize("release", RELEASES)
def test_healthy_real_exports_are_clean_for_every_release(capsys, qwen3, deepseek, release):
    for src in (qwen3, deepseek):
        code, report = doctor_json(capsys, src, f"trtllm=={release}", "--strict")
        assert (code, findings(report)) == (0, []), src


def test_one_excluded_shard_makes_the_fused_layer_bf16_where_vllm_refuses(capsys, qwen3, tmp_path):
    """Qwen3-32B's real config plus one per-projection entry (report 8's form): TensorRT-LLM 1.1+ builds qkv_proj BF16
    and the packed shards then fail copy_weight (torch's broadcast error: the packed [128, 32] into BF16 [128, 64]);
    1.0 asks only `qkv_proj`, builds it NVFP4 and loads it; vLLM refuses the model while building it."""
    src = tmp_path / "q"
    src.mkdir()
    for f in qwen3.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    edit_json(src / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].append("model.layers.0.self_attn.q_proj"))
    _, old = doctor_json(capsys, src, "trtllm==1.0.0")
    assert not findings(old, "load-error") and old["schemes"]["model.layers.0.self_attn.k_proj"] == "nvfp4"
    for release in RELEASES[1:]:
        _, report = doctor_json(capsys, src, f"trtllm=={release}")
        assert {s: report["schemes"][f"model.layers.0.self_attn.{s}"] for s in ("q_proj", "k_proj", "v_proj")} == dict.fromkeys(
            ("q_proj", "k_proj", "v_proj"), "bf16")
        errors = findings(report, "load-error")
        assert {f["subject"] for f in errors} == {f"model.layers.0.self_attn.{s}" for s in ("q_proj", "k_proj", "v_proj")}
        assert {f["runtime_error"] for f in errors} == {
            "RuntimeError: The size of tensor a (64) must match the size of tensor b (32) at non-singleton dimension 1"}
        assert not findings(report, "fused-shards")
    _, vllm = doctor_json(capsys, src, "vllm==0.32.0")
    assert findings(vllm, "fused-shards")


def test_mtp_layer_is_unquantized_only_when_its_layer_name_is_excluded(capsys, deepseek, tmp_path):
    """_get_decoder_layer_quant_config (tensorrt_llm/_torch/models/modeling_deepseekv3.py @ 000561df): MTP layer i is
    built from the target's config as model.layers.{num_hidden_layers + i}, unquantized when
    is_module_excluded_from_quantization("model.layers.61"). DeepSeek-V3-0324's real list with `model.layers.61*`
    written as the bare `model.layers.61`: every release builds the stored-BF16 MTP layer BF16 (no child entry is
    needed); without the entry it is built NVFP4 and its BF16 weights fail copy_weight (report 6's GLM-4.7 export)."""
    src = tmp_path / "d"
    src.mkdir()
    for f in deepseek.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    edit_json(src / "hf_quant_config.json", lambda d: d["quantization"].update(exclude_modules=[
        "model.layers.61" if e == "model.layers.61*" else e for e in d["quantization"]["exclude_modules"]]))
    for release in RELEASES:
        code, report = doctor_json(capsys, src, f"trtllm=={release}", "--strict")
        assert (code, findings(report)) == (0, []), release  # the entry names the layer: used, and its modules excluded
        assert report["schemes"]["model.layers.61.mlp.experts.0.down_proj"] == "bf16"
    edit_json(src / "hf_quant_config.json", lambda d: d["quantization"].update(exclude_modules=[
        e for e in d["quantization"]["exclude_modules"] if e != "model.layers.61"]))
    code, report = doctor_json(capsys, src, "trtllm==1.2.0")
    mtp = [f for f in findings(report, "load-error") if f["subject"].startswith("model.layers.61.")]
    assert code == 1 and mtp and all("no entry excludes model.layers.61" in f["message"] for f in mtp)
    assert any(f["runtime_error"].startswith("RuntimeError: The size of tensor a") for f in mtp)


def test_shipped_data_names_registered_rules_and_its_provenance():
    """Each trtllm-*.json names registered matchers, a fused policy that agrees with its matcher, and where its rules
    were read (repo, files at commits; tests/data/trtllm/PROVENANCE.md lists the same commits)."""
    provenance = (Path(__file__).parent / "data" / "trtllm" / "PROVENANCE.md").read_text()
    files = sorted(p.name for p in DATA.iterdir() if p.name.startswith("trtllm-"))
    assert files == ["trtllm-1.0.json", "trtllm-1.1.json", "trtllm-1.3.json", "trtllm-1.4.json"]
    for name in files:
        doc = json.loads((DATA / name).read_text())
        rules = doc["rules"]
        assert rules["matchers"]["modelopt"] == rules["matchers"]["compressed-tensors"]
        assert (rules["fused"]["policy"] == "fused_name_only") == rules["matchers"]["modelopt"].endswith("fused_name")
        assert doc["source"]["repo"] == "NVIDIA/TensorRT-LLM" and doc["source"]["provenance"] == "tests/data/trtllm/PROVENANCE.md"
        for path, commit in doc["source"]["files"].items():
            if not commit.startswith("unpinned"):
                assert commit.rsplit("@", 1)[-1] in provenance, (name, path)


def test_eagle3_draft_follows_its_own_config(capsys, tmp_path):
    """EAGLE-3 one-model (tensorrt_llm/_torch/models/modeling_speculative.py @ 00679c66, eagle3_model_arch "llama3"):
    the draft's config is ModelConfig.from_pretrained(<the draft's folder>): its own quantization config; only
    kv_cache_quant_algo comes from the target. ModelOpt's own EAGLE-3 export (tests/data/real/modelopt-eagle3-draft):
    its layers NVFP4 and its excluded lm_head BF16, as its config says; the same draft dequantized (no quantization
    config at all) is clean too: nothing of the target's method is inherited (SGLang inherits it, sglang PR #28196)."""
    from tools.layout_fixture import write_layout
    src = write_layout(tmp_path / "draft", "modelopt-eagle3-draft")
    for release in RELEASES:
        _, report = doctor_json(capsys, src, f"trtllm=={release}")
        assert [f["code"] for f in findings(report)] == ["unused-exclusion"]  # model.embed_tokens: not stored in a draft
        assert report["schemes"]["lm_head"] == "bf16" and report["schemes"]["layers.0.self_attn.q_proj"] == "nvfp4"
    from tests.conftest import run_captured
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "bf16", "--target", "bf16", "--quiet")
    assert code == 0, err
    for release in RELEASES:
        code, report = doctor_json(capsys, tmp_path / "bf16", f"trtllm=={release}", "--strict")
        assert (code, findings(report)) == (0, [])
        assert set(report["schemes"].values()) == {"bf16"}


def test_mixed_precision_layerwise_assignment():
    """apply_layerwise_quant_config (tensorrt_llm/_torch/models/modeling_utils.py @ cb4c622c): a MoE takes the first
    quantized_layers key (file order) that contains its name, a fused qkv the first key containing `<parent>.q_proj`
    (k/v keys are never asked: shards that disagree are no error, unlike vLLM and SGLang), a fused gate_up the first
    containing `<parent>.gate_proj` or `<parent>.gate_up_proj`, any other linear an exact key; no key: unquantized.
    DeepSeek-V4-Flash's real map (`layers.N.ffn.experts`) and a qkv whose shards the map gives different algorithms."""
    from repair.formats.algorithms import LayerAlgorithms
    from repair.targets.matchers import layer_matcher
    real = json.loads((REAL / "deepseek-v4-flash-nvfp4" / "hf_quant_config.json").read_text())["quantization"]["quantized_layers"]
    layers = LayerAlgorithms(tuple((k, v["quant_algo"]) for k, v in real.items()) + (
        ("model.layers.0.self_attn.k_proj", "NVFP4"), ("model.layers.0.self_attn.q_proj", "FP8"),
        ("model.layers.0.mlp.up_proj", "NVFP4"), ("model.layers.0.mlp.down_proj", "FP8")))
    lookup = layer_matcher(profiles.resolve("trtllm==1.3.0").profile.rules.matchers["quantized_layers"])
    asked = {name: lookup(layers, name, LLAMA)[0] for name in (
        "layers.7.ffn.experts.3.w1", "layers.7.ffn.shared_experts.w1", "model.layers.0.self_attn.k_proj",
        "model.layers.0.self_attn.qkv_proj", "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.down_proj",
        "model.layers.0.self_attn.o_proj")}
    assert asked == {"layers.7.ffn.experts.3.w1": "NVFP4", "layers.7.ffn.shared_experts.w1": None,
                     "model.layers.0.self_attn.k_proj": "FP8", "model.layers.0.self_attn.qkv_proj": "FP8",
                     "model.layers.0.mlp.gate_proj": None, "model.layers.0.mlp.down_proj": "FP8",
                     "model.layers.0.self_attn.o_proj": None}


@pytest.mark.parametrize("release", RELEASES)
def test_modelopt_mixed_precision_export_loads_including_nvfp4_awq(capsys, mixed_export, release):
    """ModelOpt's own MIXED_PRECISION export (FP8, NVFP4, W4A16_NVFP4 and an NVFP4_AWQ layer): clean for every
    release. NVFP4LinearMethod loads an NVFP4_AWQ layer's pre_quant_scale (linear.py @ 00bbf71e), where vLLM 0.32
    has no linear method for it and builds the layer unquantized (doctor's runtime-scheme error for vllm==0.32.0)."""
    code, report = doctor_json(capsys, mixed_export, f"trtllm=={release}", "--strict")
    assert (code, findings(report)) == (0, [])
    _, vllm = doctor_json(capsys, mixed_export, "vllm==0.32.0")
    (awq,) = findings(vllm, "runtime-scheme")
    assert report["schemes"][awq["subject"]] == "nvfp4"


def test_hostile_entries_are_one_line_or_plain_globs(capsys, qwen3, tmp_path):
    """An exclusion list is hostile input: a `re:` entry Python's backtracking would hang on is refused in one line
    (exit 2) where the release compiles `re:` entries (1.3+: re.fullmatch); before, it is an fnmatch glob like any
    other (linear-time translation), so it only matches nothing. Thousands of `*` and `[` are globs too."""
    src = tmp_path / "h"
    src.mkdir()
    for f in qwen3.iterdir():
        (src / f.name).write_bytes(f.read_bytes())
    edit_json(src / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].extend(
        ["re:(a+)+$", "*" * 5000 + "x", "[" * 3000]))
    from tests.conftest import run_captured
    for release in ("1.0.0", "1.1.0"):
        _, report = doctor_json(capsys, src, f"trtllm=={release}")
        assert {f["code"] for f in findings(report)} == {"unused-exclusion"}
    for release in ("1.3.0", "1.4.0"):
        code, out, err = run_captured(capsys, "doctor", src, "--target", f"trtllm=={release}")
        assert code == 2 and out == "" and err.count("\n") == 1 and "'(a+)+$' would backtrack catastrophically" in err
