"""An architecture the release's own model code refuses to build from the config transformers writes for it (the
profile's `build_refused`), told apart from one this host could not build (`unprofiled` alone: a GPU-only kernel).

vLLM 0.30's qwen4_exp/nvidia/model.py:237 raises `ValueError: Invalid layer_type indexed_attention`: transformers'
Qwen4ExpConfig rewrites every attention layer's type to `indexed_attention` (configuration_qwen4_exp.py:173-179), so
every config it writes holds it, which 0.30's decoder layer does not know (0.32's does: `_QSA_LAYER_TYPES`); 0.30 reads
config.json with its own Qwen4ExpTextConfig (transformers_utils/config.py:149), which keeps `full_attention`, the type
published configs write, and builds that. The generator records the error and the line that raised it where the
innermost frame is vLLM's own code (tools/vllm_config_refusals.py refusal_site), and the field holding the value it
quotes, where building without that field succeeds (`when`); doctor says it on every rank in vLLM's words for a config
holding it, and `fix --target` refuses in one line. The vLLM tier asks vLLM 0.30 itself
(tests/vllm/test_build_refused_vs_vllm.py)."""

from __future__ import annotations

import json

import pytest

from repair import arch
from tests.conftest import run_captured
from tests.test_qwen4exp_without_qsa import INDEXER, write

ARCH = "Qwen4ExpForCausalLM"
HOST_REASONS = ("No module named", "CUDA", "dummy base class", "ImportError")


def recorded(release: tuple[int, ...]) -> dict:
    [profile] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.release == release]
    return profile.build_refused


TRANSFORMERS_LAYERS = ["linear_attention"] * 3 + ["indexed_attention"]  # what transformers' Qwen4ExpConfig writes


def with_layers(folder, layer_types):
    config = json.loads((folder / "config.json").read_text())
    config = {k: v for k, v in config.items() if k != "layer_types"} | ({} if layer_types is None else {"layer_types": layer_types})
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture
def qwen4exp(tmp_path):
    return with_layers(write(tmp_path / "qsa", INDEXER), TRANSFORMERS_LAYERS)


def doctor(capsys, folder, target: str, *args: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_vllm_030_records_its_own_refusal_of_qwen4exp_and_no_host_failure():
    assert recorded((0, 30, 0))[ARCH] == {"error": "ValueError: Invalid layer_type indexed_attention",
                                          "raised_at": "vllm/models/qwen4_exp/nvidia/model.py:237",
                                          "when": {"field": "layer_types", "holds": "indexed_attention"}}
    for profile in arch.PROFILES:
        for name, fact in profile.build_refused.items():
            assert fact["raised_at"].startswith("vllm/") and not any(h in fact["error"] for h in HOST_REASONS), name
            assert name in profile.unprofiled and name not in profile.entries, name
        hosts = [n for n, why in profile.unprofiled.items() if any(h in why for h in HOST_REASONS)]
        assert hosts == [] or not set(hosts) & set(profile.build_refused), profile.source


def test_doctor_says_vllm_030_refuses_it_in_its_words_on_every_rank(qwen4exp, capsys):
    code, report = doctor(capsys, qwen4exp, "vllm==0.30.0", "--tp", "2")
    [f] = [f for f in report["findings"] if f["code"] == "build-refused"]
    assert code == 1 and (f["severity"], f["subject"], f["ranks"]) == ("error", ARCH, [0, 1]), f
    assert f["runtime_error"] == "ValueError: Invalid layer_type indexed_attention", f
    assert "qwen4_exp/nvidia/model.py:237" in f["message"] and "vllm 0.32.0, which builds it" in f["message"], f
    assert "config.json's layer_types holds 'indexed_attention'" in f["message"], f
    assert [(s["rank"], s["error"]) for s in report["runtime_stops_at"]] == [(r, f["runtime_error"]) for r in (0, 1)]


@pytest.mark.parametrize("layer_types", [["linear_attention"] * 3 + ["full_attention"], None, "full_attention",
                                         {"indexed_attention": 1}, [["indexed_attention"]], []])
def test_a_config_without_what_it_refuses_is_not_refused(tmp_path, capsys, layer_types):
    """The published form (`full_attention`), none (its config class derives them), and hostile shapes."""
    folder = with_layers(write(tmp_path / "published", INDEXER), layer_types)
    report = doctor(capsys, folder, "vllm==0.30.0")[1]
    assert not [f for f in report["findings"] + report["notes"] if f["code"] == "build-refused"], report["findings"]


@pytest.mark.parametrize("layer_types", ["indexed_attention", ["linear_attention"] * 3 + ["full_attention", "indexed_attention"]])
def test_a_value_the_build_never_reads_is_not_its_refusal(tmp_path, capsys, layer_types):
    """vLLM 0.30 builds layer i with `layer_types[i]`, i below num_hidden_layers (qwen4_exp/nvidia/model.py:396-406); a
    bare string, or the value past the last layer, never reaches model.py:237. vLLM 0.30 refuses both while reading
    config.json, in other words ("The `layer_types` entries must be in ...", "`num_hidden_layers` (3) must be equal to
    the number of `layer_types` (4)", asked of it in /work/venvs/vllm-0.30): doctor must not quote model.py's."""
    folder = with_layers(write(tmp_path / "odd", INDEXER), layer_types)
    report = doctor(capsys, folder, "vllm==0.30.0")[1]
    assert not [f for f in report["findings"] + report["notes"] if f["code"] == "build-refused"], report["findings"]


def test_text_config_holding_it_is_refused(tmp_path, capsys):
    folder = write(tmp_path / "vlm", INDEXER)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({"architectures": [ARCH], "text_config": config | {"layer_types": TRANSFORMERS_LAYERS}}))
    report = doctor(capsys, folder, "vllm==0.30.0")[1]
    assert [f["subject"] for f in report["findings"] if f["code"] == "build-refused"] == [ARCH], report["findings"]


def test_the_release_that_builds_it_is_told_nothing(qwen4exp, capsys):
    for target in ("vllm==0.32.0", "sglang==0.5.23", "bf16"):
        report = doctor(capsys, qwen4exp, target)[1]
        assert not [f for f in report["findings"] + report["notes"] if f["code"] == "build-refused"], target


def test_between_the_refusing_release_and_one_that_builds_it_a_note(qwen4exp, capsys, tmp_path):
    """vllm==0.31.0 takes 0.30's rows, but 0.32 builds it: 0.31 may be the release that does; a note, said by fix."""
    code, report = doctor(capsys, qwen4exp, "vllm==0.31.0")
    assert not [f for f in report["findings"] if f["code"] == "build-refused"], report["findings"]
    [note] = [n for n in report["notes"] if n["code"] == "build-refused"]
    assert "check that vllm==0.31.0 does" in note["message"], note
    code, out, err = run_captured(capsys, "fix", qwen4exp, "-o", tmp_path / "out", "--target", "vllm==0.31.0", "--dry-run")
    assert "note for vllm==0.31.0: [build-refused]" in out, out + err


@pytest.mark.parametrize("targets", ["vllm==0.30.0", "vllm==0.32.0,vllm==0.30.0"])
def test_fix_refuses_in_one_line_and_writes_nothing(qwen4exp, tmp_path, capsys, targets):
    out_dir = tmp_path / "out"
    code, out, err = run_captured(capsys, "fix", qwen4exp, "-o", out_dir, "--target", targets)
    assert code == 2 and err.count("\n") == 1 and "[build-refused]" in err and "indexed_attention" in err, out + err
    assert not out_dir.exists()


def test_an_architecture_this_host_cannot_build_is_not_called_refused(tmp_path, capsys):
    """KimiLinear is unprofiled for a kernel package this host lacks (`cutlass`): nothing said about the release."""
    folder = write(tmp_path / "kimi", {})
    config = json.loads((folder / "config.json").read_text()) | {"architectures": ["KimiLinearForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    report = doctor(capsys, folder, "vllm==0.32.0")[1]
    assert not [f for f in report["findings"] + report["notes"] if f["code"] == "build-refused"], report


DSV4 = "DeepseekV4ForCausalLM"
FP8_KV = {"dynamic": False, "num_bits": 8, "type": "float"}  # ModelOpt's config.json kv_cache_scheme (tools/real_fixture qwen36)


def dsv4_modelopt(folder, kv_cache_scheme):
    """tools/dsv4_fixture.py's checkpoint under a ModelOpt config.json quantization_config (the form ModelOpt 0.31+
    writes), with or without its FP8 KV-cache declaration: only the config is read by the build refusal."""
    from tools.dsv4_fixture import write as write_dsv4

    write_dsv4(folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "ignore": ["lm_head"], **({"kv_cache_scheme": kv_cache_scheme} if kv_cache_scheme else {})}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_vllm_028_refuses_deepseek_v4_without_an_fp8_kv_cache(tmp_path, capsys):
    """0.28's DeepSeek-V4 attention (FlashMLA, the class a non-SM12 CUDA host builds: nvidia/model.py:770-801) asserts
    an fp8 KV cache (attention.py:106); with none declared and no --kv-cache-dtype the cache dtype stays `auto`."""
    report = doctor(capsys, dsv4_modelopt(tmp_path / "dsv4", None), "vllm==0.28.0")[1]
    assert [f["subject"] for f in report["findings"] if f["code"] == "build-refused"] == [DSV4], report["findings"]


def test_vllm_028_builds_deepseek_v4_whose_config_declares_an_fp8_kv_cache(tmp_path, capsys):
    """vLLM 0.28 resolves --kv-cache-dtype auto from a ModelOpt config.json's kv_cache_scheme or kv_cache_quant_algo
    (engine/arg_utils.py:1986, utils/torch_utils.py:427-509 resolve_kv_cache_dtype_string: {num_bits 8, type float,
    dynamic false} -> fp8), and then its DeepSeek-V4 attention takes the fp8_ds_mla layout (attention.py:104-114). The
    generator builds the model again with each declaration (tools/vllm_variants.py QUANT_VARIANTS): the refusal is gone
    (the build stops later at this host's CUDA-only o_proj kernel), so the refusal is recorded `unless` either."""
    unless = recorded((0, 28, 0))[DSV4]["unless"]
    assert [(u["field"], u.get("includes", u.get("any_case"))) for u in unless] == [
        ("quantization_config.kv_cache_scheme", FP8_KV), ("quantization_config.kv_cache_quant_algo", "FP8")], unless
    assert all(u["with"] == [{"field": "quantization_config.quant_method", "starts_with": "modelopt"}] for u in unless)
    assert all("attention.py:106" not in u["then"] for u in unless), unless
    report = doctor(capsys, dsv4_modelopt(tmp_path / "dsv4", FP8_KV), "vllm==0.28.0")[1]
    assert not [f for f in report["findings"] + report["notes"] if f["code"] == "build-refused"], report["findings"]


@pytest.mark.parametrize("fields", [{"kv_cache_scheme": dict(FP8_KV, num_bits=8.0)},
                                    {"kv_cache_scheme": dict(FP8_KV, strategy="tensor")},
                                    {"kv_cache_quant_algo": "fp8"}, {"kv_cache_quant_algo": "Fp8"},
                                    {"kv_cache_scheme": FP8_KV, "quant_method": "modelopt_fp4"}])
def test_vllm_028_builds_deepseek_v4_from_each_fp8_declaration_its_reading_takes(tmp_path, capsys, fields):
    """0.28's get_kv_cache_quant_algo_string (utils/torch_utils.py:436-469) reads a quant_method starting with
    "modelopt", a kv_cache_scheme by `dynamic is False and num_bits == 8 and type == "float"` (8.0 == 8, other keys
    unread) and a kv_cache_quant_algo lowered: each of these is fp8 to it, so its DeepSeek-V4 attention passes
    (doctor called them refused: the conditions compared the recorded values strictly). The generator builds the model
    with such values (tools/vllm_variants.py read_alike) and records the conditions as wide (tier: 0.28's own reader)."""
    folder = dsv4_modelopt(tmp_path / "dsv4", None)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"].update(fields)
    (folder / "config.json").write_text(json.dumps(config))
    report = doctor(capsys, folder, "vllm==0.28.0")[1]
    assert not [f for f in report["findings"] + report["notes"] if f["code"] == "build-refused"], report["findings"]


@pytest.mark.parametrize("scheme", [{"dynamic": False, "num_bits": 4, "type": "float"}, dict(FP8_KV, num_bits="8"),
                                    dict(FP8_KV, num_bits=True), dict(FP8_KV, dynamic=0), "fp8-not-a-dict", None])
def test_vllm_028_still_refuses_deepseek_v4_whose_kv_cache_is_not_the_recorded_fp8(tmp_path, capsys, scheme):
    """Any other declaration (NVFP4, a string where 0.28 compares num_bits == 8, no declaration) keeps the refusal, and
    its line says which declaration the release builds with, as recorded."""
    folder = dsv4_modelopt(tmp_path / "dsv4", None)
    config = json.loads((folder / "config.json").read_text())
    if scheme is not None:
        config["quantization_config"]["kv_cache_scheme"] = scheme
    (folder / "config.json").write_text(json.dumps(config))
    report = doctor(capsys, folder, "vllm==0.28.0")[1]
    [found] = [f for f in report["findings"] if f["code"] == "build-refused"]
    assert "quantization_config.kv_cache_scheme holds {\"dynamic\": false, \"num_bits\": 8, \"type\": \"float\"}" in found["message"], found
    assert "no change to the files" not in found["message"], found


@pytest.mark.parametrize("method, refused", [("compressed-tensors", True), ("modelopt", False)])
def test_vllm_028_reads_a_declared_fp8_kv_cache_of_modelopt_only(method, refused):
    """vLLM 0.28's get_kv_cache_quant_algo_string reads kv_cache_scheme / kv_cache_quant_algo only where quant_method
    starts with "modelopt" (utils/torch_utils.py:436-437), else --kv-cache-dtype auto stays auto and DeepSeek-V4's
    attention refuses (attention.py:106): RedHatAI's compressed-tensors DeepSeek-V4-Flash config with ModelOpt's FP8
    declaration written in is still refused; the same with quant_method modelopt is not."""
    from pathlib import Path

    from repair.doctor.refused_load import build_refused_findings
    from repair.targets.profiles import resolve

    config = json.loads((Path(__file__).parent / "data/real/redhatai-deepseek-v4-flash-nvfp4-fp8/config.json").read_text())
    config["quantization_config"] = dict(config["quantization_config"], quant_method=method, kv_cache_scheme=FP8_KV)
    errors, _ = build_refused_findings(resolve("vllm==0.28.0"), DSV4, config, 1)
    assert bool(errors) is refused, errors
