"""inspect and doctor on ModelOpt MIXED_PRECISION checkpoints: per-layer algorithms, contradictions, KV-cache scales.

The healthy model (tests/mixed_helpers.py): NVFP4 MLP, FP8 attention, lm_head excluded, an NVFP4_AWQ
layer, W4A16_NVFP4 gate/up, FP8 KV cache declared with its scales stored.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import run_captured
from tests.mixed_helpers import healthy_layers, tensors_for, write_mixed, write_single_nested


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("doctor-mixed") / "healthy")


def doctor(capsys, folder, *args) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--strict", "--json", *args)
    assert code in (0, 1), err
    return code, json.loads(out)


def found(report: dict) -> dict[str, dict]:
    return {f["subject"]: f for f in report["findings"]}


# vLLM 0.32 modelopt.py LINEAR_ALGOS (+ UnquantizedLinearMethod for what is not in it): declared -> built
VLLM_BUILDS = {"FP8": "fp8", "NVFP4": "nvfp4", "W4A16_NVFP4": "w4a16_nvfp4", "NVFP4_AWQ": "bf16"}


def loadable_layers() -> dict[str, str]:
    """The healthy model's layers, its NVFP4_AWQ layer (which vLLM 0.32 cannot build) made NVFP4."""
    return {name: "NVFP4" if algo == "NVFP4_AWQ" else algo for name, algo in healthy_layers().items()}


def test_strict_doctor_is_clean_on_the_healthy_mixed_checkpoint_without_awq(capsys, tmp_path):
    folder = write_mixed(tmp_path / "no-awq", loadable_layers())
    code, report = doctor(capsys, folder)
    assert (code, report["findings"], report["notes"]) == (0, [], [])
    code, text, _ = run_captured(capsys, "doctor", folder, "--strict")
    assert code == 0 and "0 error(s), 0 warning(s)" in text
    assert "layers built as: 8 fp8, 4 nvfp4, 2 bf16, 2 w4a16_nvfp4" in text


def test_an_nvfp4_awq_layer_under_mixed_precision_is_built_unquantized_and_cannot_load(capsys, healthy):
    """vLLM 0.32 has no NVFP4_AWQ linear method: the layer gets UnquantizedLinearMethod, its packed weight fails."""
    code, report = doctor(capsys, healthy)
    awq = "model.layers.1.mlp.down_proj"
    assert code == 1 and [(f["code"], f["subject"], f["severity"]) for f in report["findings"]] == [("runtime-scheme", awq, "error")]
    assert "declared NVFP4_AWQ, for which vllm==0.32.0 has no linear method" in report["findings"][0]["message"]
    assert {n: report["schemes"][n] for n in healthy_layers()} == {n: VLLM_BUILDS[a] for n, a in healthy_layers().items()}
    assert report["schemes"]["lm_head"] == "bf16"


def test_inspect_text_shows_stored_and_declared_algorithms(capsys, healthy):
    code, text, _ = run_captured(capsys, "inspect", healthy)
    assert code == 0
    assert "format: modelopt-mixed; declared: MIXED_PRECISION; excluded: -; KV cache: FP8" in text
    rows = {line.split()[0]: line.split() for line in text.splitlines()[3:-1]}
    for name, algo in healthy_layers().items():
        assert rows[name][-3:] == ["quantized", algo, algo], rows[name]
    assert rows["lm_head"][-3:] == ["excluded", "-", "-"]


def test_inspect_json_adds_the_algorithm_fields(capsys, healthy):
    code, out, _ = run_captured(capsys, "inspect", healthy, "--json")
    report = json.loads(out)
    assert code == 0 and report["format"] == "modelopt-mixed"
    assert report["declaration"]["kv_cache"] == "FP8"
    assert {k: v for k, v in report["declaration"]["quantized_layers"].items()} == healthy_layers()
    modules = {m["name"]: m for m in report["modules"]}
    assert {n: (modules[n]["algorithm"], modules[n]["declared_algorithm"]) for n in healthy_layers()} == {
        n: (a, a) for n, a in healthy_layers().items()}
    assert (modules["lm_head"]["algorithm"], modules["lm_head"]["declared_algorithm"], modules["lm_head"]["declared"]) == (None, None, "excluded")
    assert modules["model.layers.0.self_attn.q_proj"]["precision"] == "fp8"


def _stored_as(layers: dict[str, str], name: str, algo: str, tmp: Path, **kw) -> Path:
    """The healthy checkpoint's configs, with `name`'s tensors stored as `algo`."""
    stored = dict(layers, **{name: algo})
    return write_mixed(tmp, layers, tensors=tensors_for(stored), **kw)


@pytest.mark.parametrize("name, stored, severity", [
    ("model.layers.0.self_attn.o_proj", "NVFP4", "error"),  # declared FP8, stored NVFP4
    ("model.layers.0.mlp.down_proj", "FP8", "error"),  # declared NVFP4, stored FP8
    ("model.layers.0.mlp.down_proj", "W4A16_NVFP4", "error"),  # declared NVFP4, no input_scale
    ("model.layers.1.mlp.down_proj", "NVFP4", "error"),  # declared NVFP4_AWQ, no pre_quant_scale
])
def test_stored_tensors_contradicting_the_declared_algorithm(capsys, tmp_path, name, stored, severity):
    layers = healthy_layers()
    code, report = doctor(capsys, _stored_as(layers, name, stored, tmp_path / "x"))
    finding = found(report)[name]
    assert code == 1 and (finding["code"], finding["severity"]) == ("algorithm-mismatch", severity)
    assert finding["message"].startswith(f"{name}: declared {layers[name]} but its tensors are {stored} (")
    assert [f["subject"] for f in report["findings"] if f["code"] == "algorithm-mismatch"] == [name]


def test_a_weight_only_layer_storing_an_input_scale_is_a_note(capsys, tmp_path):
    """Declared W4A16_NVFP4, stored with an input_scale: vLLM 0.32 registers the scale only to drop it (modelopt.py
    _DropInputScale, "deprecated"), so the layer loads as declared: a note, which --strict does not count."""
    layers = loadable_layers()
    name = "model.layers.1.mlp.gate_proj"
    stored = dict(layers, **{name: "NVFP4", "model.layers.1.mlp.up_proj": "NVFP4"})  # siblings share their scale
    code, report = doctor(capsys, write_mixed(tmp_path / "x", layers, tensors=tensors_for(stored)))
    assert (code, report["findings"]) == (0, [])
    assert [(n["code"], n["subject"]) for n in report["notes"]] == [("algorithm-mismatch", name)]
    assert report["notes"][0]["message"].startswith(f"2 layer(s) declared W4A16_NVFP4 store an input_scale ({name}, ...): vLLM 0.32")


def test_kv_scales_without_a_declaration(capsys, tmp_path):
    code, report = doctor(capsys, write_mixed(tmp_path / "x", kv=False, kv_scales=True))
    kv = [f for f in report["findings"] if f["code"] == "kv-cache-scales"]
    assert code == 1 and len(kv) == 1 and kv[0]["severity"] == "warning"
    assert kv[0]["subject"] == "model.layers.0.self_attn.k_proj.k_scale"
    assert kv[0]["message"].startswith("4 KV-cache scale tensor(s) (model.layers.0.self_attn.k_proj.k_scale, ...) but no KV-cache")


def test_kv_scales_left_in_a_bf16_target_output_are_flagged(capsys, tmp_path):
    """The issue's complaint: k_scale/v_scale kept in an output that declares no quantization passed --strict."""
    plain = {k: v for k, v in tensors_for({}).items()}
    src = write_mixed(tmp_path / "bf16", {"lm_head": "FP8"}, tensors=plain)
    (src / "hf_quant_config.json").unlink()
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config")
    (src / "config.json").write_text(json.dumps(config))
    code, report = doctor(capsys, src, "--target", "bf16")
    assert code == 1 and [f["code"] for f in report["findings"]] == ["kv-cache-scales"]


def test_a_kv_declaration_without_scales_is_a_note(capsys, tmp_path):
    """vLLM loads it and runs with scale 1.0 (and says so): a note, which --strict does not count."""
    code, report = doctor(capsys, write_mixed(tmp_path / "x", loadable_layers(), kv=True, kv_scales=False))
    assert (code, report["findings"]) == (0, [])
    assert [(n["code"], n["subject"]) for n in report["notes"]] == [("kv-cache-scales", "config.json / hf_quant_config.json")]
    code, text, _ = run_captured(capsys, "doctor", tmp_path / "x")
    assert "note: [kv-cache-scales] the config declares a FP8 KV cache but no k_scale / v_scale tensors are stored" in text


def test_quantized_layers_disagreeing_between_files(capsys, healthy, tmp_path):
    src = write_mixed(tmp_path / "x")
    hf = json.loads((src / "hf_quant_config.json").read_text())
    hf["quantization"]["quantized_layers"]["model.layers.0.mlp.up_proj"] = {"quant_algo": "FP8"}
    (src / "hf_quant_config.json").write_text(json.dumps(hf))
    code, report = doctor(capsys, src)
    disagree = [f for f in report["findings"] if f["code"] == "configs-disagree"]
    assert code == 1 and len(disagree) == 1 and disagree[0]["severity"] == "warning"
    assert "disagree on 1 layer(s) (config.json / hf_quant_config.json): model.layers.0.mlp.up_proj (NVFP4 / FP8)" in disagree[0]["message"]
    assert not [f for f in report["findings"] if f["code"] == "algorithm-mismatch"]  # config.json (vLLM's) matches the tensors


def test_a_layer_left_out_of_quantized_layers_but_stored_quantized(capsys, tmp_path):
    layers = healthy_layers()
    src = write_mixed(tmp_path / "x", {k: v for k, v in layers.items() if k != "model.layers.0.self_attn.o_proj"},
                      tensors=tensors_for(layers))
    code, report = doctor(capsys, src)
    assert code == 1 and found(report)["model.layers.0.self_attn.o_proj"]["code"] == "config-contradiction"


def test_bad_fp8_scale_is_an_error(capsys, tmp_path):
    tensors = tensors_for(healthy_layers())
    tensors["model.layers.0.self_attn.o_proj.weight_scale"] = torch.tensor(float("nan"))
    code, report = doctor(capsys, write_mixed(tmp_path / "x", tensors=tensors))
    f = found(report)["model.layers.0.self_attn.o_proj.weight_scale"]
    assert code == 1 and (f["code"], f["severity"]) == ("fp8-scale", "error") and "is NaN" in f["message"]


def test_single_nvfp4_awq_is_read_but_vllm_refuses_it(capsys, tmp_path):
    layers = {k: "NVFP4_AWQ" for k in healthy_layers() if ".mlp." in k}
    src = write_mixed(tmp_path / "awq", layers, kv=False)
    for name, key in (("config.json", "quantization_config"), ("hf_quant_config.json", "quantization")):
        data = json.loads((src / name).read_text())
        section = data[key]
        section.pop("quantized_layers")
        section.pop("config_groups", None)
        section["quant_algo"] = "NVFP4_AWQ"
        (src / name).write_text(json.dumps(data))
    code, out, _ = run_captured(capsys, "inspect", src)
    assert code == 0 and "declared: NVFP4_AWQ" in out
    code, report = doctor(capsys, src)
    refusal = found(report)["hf_quant_config.json"]
    assert code == 1 and refusal["code"] == "quant-config" and refusal["runtime_error"].startswith("ValueError: ModelOpt currently only supports:")
    assert not [f for f in report["findings"] if f["code"] == "algorithm-mismatch"]


def _simulate(tensors: list[tuple[str, str, tuple[int, ...]]], precision: str) -> dict[str, str]:
    """vllm_loader.simulate for one row-parallel 64x128 layer built as `precision` (tp 1)."""
    from repair.arch import LayerKind, ModuleSpec
    from repair.io.safetensors import TensorInfo
    from repair.targets import vllm_loader
    from repair.targets.profiles import resolve

    spec = ModuleSpec("layer", (64, 128), "o_proj")
    infos = [TensorInfo(name, dtype, shape, 0, 0) for name, dtype, shape in tensors]
    outcomes = vllm_loader.simulate(infos, {"layer": spec}, {"layer": precision}, resolve("vllm==0.32.0"),
                                    kinds={"o_proj": LayerKind("row", "RowParallelLinear")})
    return {o.tensor: o.status for o in outcomes}


FP8_LAYER = [("layer.weight", "F8_E4M3", (64, 128)), ("layer.weight_scale", "F32", ()), ("layer.input_scale", "F32", ())]
W4A16_LAYER = [("layer.weight", "U8", (64, 64)), ("layer.weight_scale", "F8_E4M3", (64, 8)), ("layer.weight_scale_2", "F32", ())]


def test_loader_knows_fp8_and_w4a16_parameters():
    """vLLM 0.32 modelopt.py: KFp8StaticTensor registers weight (float8 [out, in]), weight_scale and input_scale
    (per tensor); the W4A16 NVFP4 method registers the NVFP4 parameters, and input_scale only to drop it."""
    assert set(_simulate(FP8_LAYER, "fp8").values()) == {"ok"}
    assert set(_simulate(W4A16_LAYER, "w4a16_nvfp4").values()) == {"ok"}
    assert set(_simulate(W4A16_LAYER + [("layer.input_scale", "F32", ())], "w4a16_nvfp4").values()) == {"ok"}
    assert _simulate(W4A16_LAYER, "fp8")["layer.weight"] == "error"  # a packed [out, in/2] weight does not fit [out, in]
    assert _simulate(W4A16_LAYER, "fp8")["layer.weight_scale_2"] == "error"  # no such parameter in an FP8 layer
    assert _simulate([("layer.weight", "BF16", (64, 128))], "fp8")["layer.weight"] == "garbage"  # fits, wrong meaning
    assert _simulate(FP8_LAYER, "bf16")["layer.weight"] == "garbage"


@pytest.mark.parametrize("release", ["0.28.0", "0.30.0", "0.32.0"])
def test_vllm_refuses_mixed_precision_read_from_hf_quant_config(capsys, tmp_path, release):
    """vLLM 0.32 reads hf_quant_config.json where config.json has no quantization_config, and its config reading refuses
    ModelOpt's nested form for any quant_algo but the FP8 ones and NVFP4, before any layer is built (its data's
    `modelopt_nested_refused`, from tools/vllm_nested_algos.py; vLLM's own load of a DeepSeek-V4 export so stops:
    tests/vllm/test_dsv4_gpu_class_vs_vllm.py); 0.28 and 0.30 run the same code (model_arch_config_convertor.py,
    their regenerated data). The same model with config.json's quantization_config loads."""
    code, report = doctor(capsys, write_mixed(tmp_path / "hf-only", config_json=False), "--target", f"vllm=={release}")
    refused = [f for f in report["findings"] if f["code"] == "quant-config"]
    assert code == 1 and [f["runtime_error"] for f in refused] == ["ValueError: Unknown ModelOpt quant algo: MIXED_PRECISION"]
    assert refused[0]["subject"] == "hf_quant_config.json", refused
    code, report = doctor(capsys, write_mixed(tmp_path / "both"), "--target", f"vllm=={release}")
    assert not [f for f in report["findings"] if f["code"] == "quant-config"], report["findings"]


@pytest.mark.parametrize("release", ["0.28.0", "0.30.0", "0.32.0"])
@pytest.mark.parametrize("algo", ["NVFP4_AWQ", "nvfp4_awq"])
def test_vllm_refuses_an_algo_its_list_lacks_in_the_nested_form_with_its_own_words(capsys, tmp_path, algo, release):
    """NVFP4_AWQ is in no list of vLLM 0.32's ModelOpt configs: its config reading refuses the nested form declaring it
    with `Unknown ModelOpt quant algo: <as written>` (the data's "*" rule, tools/vllm_nested_algos.py; vLLM's own load
    of this checkpoint: tests/vllm/test_nested_algos_vs_vllm.py), before its ModelOpt config's list is ever asked."""
    code, report = doctor(capsys, write_single_nested(tmp_path / "awq", algo), "--target", f"vllm=={release}")
    refused = [f for f in report["findings"] if f["code"] == "quant-config"]
    assert code == 1 and [f["runtime_error"] for f in refused] == [f"ValueError: Unknown ModelOpt quant algo: {algo}"], refused


def test_nested_algos_tool_stops_on_a_release_without_the_config_step(monkeypatch):
    """tools/vllm_nested_algos.py reads vLLM's model_arch_config_convertor (0.28-0.32); a release without it is not
    read as refusing nothing (that had been the tool's guess): it stops and says what to read."""
    import importlib
    import sys
    import types

    monkeypatch.syspath_prepend(str(Path(__file__).parents[1] / "tools"))
    modelopt = types.ModuleType("vllm.model_executor.layers.quantization.modelopt")
    modelopt.QUANT_ALGOS = ["FP8", "NVFP4"]
    monkeypatch.setitem(sys.modules, "vllm.model_executor.layers.quantization.modelopt", modelopt)
    monkeypatch.setitem(sys.modules, "vllm.transformers_utils.model_arch_config_convertor", None)  # import fails
    with pytest.raises(SystemExit, match="model_arch_config_convertor"):
        importlib.import_module("vllm_nested_algos").modelopt_nested_refused()
