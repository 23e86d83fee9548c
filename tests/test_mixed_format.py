"""ModelOpt MIXED_PRECISION and the other single algorithms: detection, refusals, per-layer resolution, config rewrites.

Config files come from ModelOpt's own converter (mixed_helpers.quantization_config); tensors are
real layouts written by repair.codec (byte-identical to ModelOpt's quantizers).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mixed_helpers import groups_by_algo, healthy_layers, write_mixed
from repair import arch, formats
from repair.errors import BadInput
from repair.formats.algorithms import LayerAlgorithms
from repair.formats.modelopt_mixed import MODELOPT_MIXED
from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
from repair.io.checkpoint import open_checkpoint
from tests.conftest import read_json, run_captured

SUPPORTED = ("this tool reads ModelOpt NVFP4, W4A16_NVFP4, NVFP4_AWQ, FP8 (per-tensor) and MIXED_PRECISION "
             "checkpoints whose layers use those")


@pytest.fixture(scope="module")
def healthy(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("mixed") / "healthy")


def declaration(folder: Path):
    ckpt = open_checkpoint(folder)
    return formats.detect(ckpt).read_declaration(ckpt)


def edit(src: Path, dst: Path, config=None, hf=None) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    for name, change in (("config.json", config), ("hf_quant_config.json", hf)):
        if change is not None:
            data = read_json(dst / name)
            change(data)
            (dst / name).write_text(json.dumps(data))
    return dst


def test_detects_mixed_from_either_file(healthy, tmp_path):
    assert formats.detect(open_checkpoint(healthy)) is MODELOPT_MIXED
    only_hf = write_mixed(tmp_path / "hf-only", config_json=False)
    d = declaration(only_hf)
    assert d.format is MODELOPT_MIXED and d.quant_algo == "MIXED_PRECISION" and d.kv_cache == "FP8"
    assert d.layer_algos.as_dict() == healthy_layers()


def test_declaration_reads_config_json_layers_and_kv_scheme(healthy):
    d = declaration(healthy)
    assert d.layer_algos.as_dict() == healthy_layers() == d.hf_layer_algos.as_dict()
    assert (d.ignore, d.exclude_modules, d.kv_cache) == ((), (), "FP8")  # no exclude_modules: an empty list, as for NVFP4


@pytest.mark.parametrize("algo", ["W4A16_NVFP4", "NVFP4_AWQ", "FP8", "nvfp4"])
def test_single_algorithms_read_like_nvfp4(healthy, tmp_path, algo):
    def single(section):
        section.pop("quantized_layers", None)
        section.pop("config_groups", None)
        section["quant_algo"] = algo
    src = edit(healthy, tmp_path / algo, config=lambda c: single(c["quantization_config"]), hf=lambda h: single(h["quantization"]))
    d = declaration(src)
    assert d.format is MODELOPT_NVFP4 and d.quant_algo == algo.upper() and d.layer_algos is None
    assert d.algorithm("model.layers.0.mlp.down_proj") == algo.upper()


@pytest.mark.parametrize("algo", ["MXFP4", "FP8_PB_WO", "FP8_BLOCK_SCALES", "FP8_PER_CHANNEL_PER_TOKEN", "MXFP8", "W4A8_AWQ",
                                  "INT4_AWQ", "SOMETHING_NEW"])
def test_other_single_algorithms_are_refused_in_one_line(capsys, healthy, tmp_path, algo):
    def single(section):
        section.pop("quantized_layers", None)
        section["quant_algo"] = algo
    src = edit(healthy, tmp_path / algo, config=lambda c: c.pop("quantization_config"), hf=lambda h: single(h["quantization"]))
    code, out, err = run_captured(capsys, "inspect", src)
    assert (code, out) == (2, "")
    assert err == f"error: {src / 'hf_quant_config.json'}: quant_algo {algo!r} is not supported; {SUPPORTED}\n"


def test_a_mixed_layer_of_another_algorithm_is_refused(capsys, healthy, tmp_path):
    layer = "model.layers.0.mlp.down_proj"
    src = edit(healthy, tmp_path / "mxfp8",
               config=lambda c: c["quantization_config"]["quantized_layers"][layer].update(quant_algo="MXFP8"))
    code, _, err = run_captured(capsys, "doctor", src)
    assert code == 2
    assert err == (f"error: {src / 'config.json'}: quantization_config.quantized_layers[{layer!r}] quant_algo 'MXFP8' "
                   f"is not supported; {SUPPORTED}\n")


@pytest.mark.parametrize("bad, text", [
    ([1, 2], "quantization_config.quantized_layers must be an object of layer name -> {\"quant_algo\": ...}; fix the config"),
    ({"model.layers.0.mlp.down_proj": {"group_size": 16}},
     "quantization_config.quantized_layers['model.layers.0.mlp.down_proj'] has no quant_algo string; fix the config"),
    ({"bad name\n": {"quant_algo": "FP8"}},
     "quantization_config.quantized_layers has a layer name 'bad name\\n' that is empty, too long or holds spaces or control "
     "characters; fix the config"),
    ({"x": {"quant_algo": "NVFP4", "group_size": 32}}, "quantization_config.quantized_layers['x'] group_size 32 is not NVFP4's 16; fix the config"),
    ({}, "quant_algo MIXED_PRECISION without a non-empty quantized_layers map, which vLLM refuses; re-download the checkpoint, "
         "or copy quantized_layers from the other config file"),
])
def test_hostile_layer_maps_are_bad_input(capsys, healthy, tmp_path, bad, text):
    src = edit(healthy, tmp_path / "bad", config=lambda c: c["quantization_config"].update(quantized_layers=bad))
    code, _, err = run_captured(capsys, "inspect", src)
    assert (code, err) == (2, f"error: {src / 'config.json'}: {text}\n")


def test_files_naming_different_algorithms_are_refused(capsys, healthy, tmp_path):
    src = edit(healthy, tmp_path / "differ", hf=lambda h: h["quantization"].update(quant_algo="NVFP4"))
    code, _, err = run_captured(capsys, "inspect", src)
    assert code == 2 and err.startswith(f"error: {src / 'config.json'} and {src / 'hf_quant_config.json'} declare different quant_algo")


# vLLM 0.32 ModelOptMixedPrecisionConfig._resolve_quant_algo's order (tests/vllm/test_mixed_declared_vs_vllm.py
# checks the same cases against vLLM's own class)
RESOLUTION_LAYERS = {
    "model.layers.0.self_attn.q_proj": "FP8", "model.layers.0.self_attn.k_proj": "FP8", "model.layers.0.self_attn.v_proj": "FP8",
    "model.layers.0.mlp.experts.0.gate_proj": "NVFP4", "model.layers.0.mlp.experts.1.gate_proj": "W4A16_NVFP4",
    "layers.1.ffn.experts": "NVFP4", "model.layers.2.moe.gate_proj": "W4A16_NVFP4",
    "model.layers.3.self_attn.q_proj": "FP8", "model.layers.3.self_attn.k_proj": "NVFP4", "lm_head": "FP8",
}
RESOLUTION_CASES = [
    ("model.layers.0.self_attn.q_proj", "FP8"),  # direct
    ("model.layers.0.self_attn.qkv_proj", "FP8"),  # packed shards agree
    ("model.layers.0.mlp.experts", "NVFP4"),  # parent prefix: the first key under it
    ("layers.1.ffn.experts", "NVFP4"),  # direct, DeepSeek-V4 style
    ("model.layers.2.moe.experts", "W4A16_NVFP4"),  # `.experts` falls back to its parent
    ("model.layers.0.mlp.down_proj", None),  # not found: unquantized
    ("model.lm_head", "FP8"),  # the lm_head candidate
    ("model.layers.3.self_attn.o_proj", None),
]


@pytest.mark.parametrize("prefix, algo", RESOLUTION_CASES)
def test_layer_resolution_follows_vllm_order(prefix, algo):
    layers = LayerAlgorithms(tuple(RESOLUTION_LAYERS.items()))
    assert layers.resolve(prefix, {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}) == algo


def test_fused_shards_that_disagree_give_vllms_error():
    layers = LayerAlgorithms(tuple(RESOLUTION_LAYERS.items()))
    assert layers.lookup("model.layers.3.self_attn.qkv_proj") == (
        None, "ValueError: Mixed quant_algo within fused layer model.layers.3.self_attn.qkv_proj: {'FP8', 'NVFP4'}. "
              "All shards must use the same quantization.")


def test_exclusions_still_exclude_and_experts_resolve_as_one_layer(healthy, tmp_path):
    src = edit(healthy, tmp_path / "ex", config=lambda c: c["quantization_config"].update(ignore=["model.layers.1.self_attn*"]))
    d = declaration(src)
    assert d.algorithm("model.layers.1.self_attn.q_proj") is None and d.excludes("model.layers.1.self_attn.q_proj")
    assert d.algorithm("model.layers.0.self_attn.q_proj") == "FP8" and not d.excludes("model.layers.0.self_attn.q_proj")
    assert d.excludes("lm_head") and not d.excludes("lm_head", [])  # unlisted: unquantized; an explicit list asks the list only
    moe = LayerAlgorithms((("model.layers.0.mlp.experts.0.down_proj", "NVFP4"),))
    assert d.__class__(d.quant_algo, (), None, d.format, None, moe).algorithm("model.layers.0.mlp.experts.7.up_proj") == "NVFP4"


def _covers(ckpt, d):
    return arch.architecture(ckpt.config).exclusion_matcher(d)


def test_with_exclusions_keeps_both_files_in_agreement(healthy):
    ckpt = open_checkpoint(healthy)
    d = MODELOPT_MIXED.read_declaration(ckpt)
    attn = [f"model.layers.1.self_attn.{p}" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    config, hf = MODELOPT_MIXED.with_exclusions(ckpt, attn + ["model.layers.1.mlp.down_proj"], _covers(ckpt, d),
                                                remove=["lm_head"])
    qc = config["quantization_config"]
    assert qc["quantized_layers"] == hf["quantization"]["quantized_layers"]
    expected = {k: v for k, v in healthy_layers().items() if k not in attn and k != "model.layers.1.mlp.down_proj"} | {"lm_head": "NVFP4"}
    assert {k: v["quant_algo"] for k, v in qc["quantized_layers"].items()} == expected
    assert qc["quantized_layers"]["lm_head"] == {"quant_algo": "NVFP4", "group_size": 16}
    grouped = groups_by_algo(qc)
    assert {a: sorted(t) for a, t in grouped.items()} == {a: sorted(k for k, v in expected.items() if v == a) for a in set(expected.values())}
    assert "NVFP4_AWQ" not in grouped  # its only layer left: the emptied group is dropped
    assert qc["ignore"] == [] and hf["quantization"]["exclude_modules"] == []


def test_with_exclusions_resolves_disagreeing_maps_to_config_json(healthy, tmp_path):
    src = edit(healthy, tmp_path / "disagree", hf=lambda h: h["quantization"]["quantized_layers"].pop("model.layers.0.mlp.up_proj"))
    ckpt = open_checkpoint(src)
    d = MODELOPT_MIXED.read_declaration(ckpt)
    config, hf = MODELOPT_MIXED.with_exclusions(ckpt, ["model.layers.0.mlp.down_proj"], _covers(ckpt, d))
    assert config["quantization_config"]["quantized_layers"] == hf["quantization"]["quantized_layers"]
    assert "model.layers.0.mlp.up_proj" in hf["quantization"]["quantized_layers"]


def test_a_layer_resolved_through_its_parent_is_also_listed_as_excluded(healthy, tmp_path):
    """A routed-experts key covers every expert: dequantizing one expert cannot drop the key, so it is excluded by name."""
    def parent(section):
        section["quantized_layers"]["model.layers.0.mlp"] = {"quant_algo": "NVFP4", "group_size": 16}
    src = edit(healthy, tmp_path / "parent", config=lambda c: parent(c["quantization_config"]), hf=lambda h: parent(h["quantization"]))
    ckpt = open_checkpoint(src)
    d = MODELOPT_MIXED.read_declaration(ckpt)
    config, hf = MODELOPT_MIXED.with_exclusions(ckpt, ["model.layers.0.mlp.experts.3.up_proj"], _covers(ckpt, d))
    assert config["quantization_config"]["ignore"] == ["model.layers.0.mlp.experts.3.up_proj"] == hf["quantization"]["exclude_modules"]


def test_without_quantization_drops_the_whole_declaration(healthy):
    config = MODELOPT_MIXED.without_quantization(open_checkpoint(healthy))
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]


def test_bad_types_are_refused_not_crashed(capsys, healthy, tmp_path):
    src = edit(healthy, tmp_path / "groups", config=lambda c: c["quantization_config"].update(config_groups=[1]))
    code, _, err = run_captured(capsys, "inspect", src)
    assert (code, err) == (2, f"error: {src / 'config.json'}: quantization_config.config_groups must be an object of objects; fix the config\n")
    with pytest.raises(BadInput):
        MODELOPT_MIXED.read_declaration(open_checkpoint(src))


def test_hostile_mixed_configs_give_bad_input_or_a_declaration():
    """Any JSON where a MIXED_PRECISION config holds its maps: a declaration, or one of our errors (never a crash)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from repair.errors import RepairError
    from repair.io.checkpoint import Checkpoint
    from tests.test_fuzz import json_values

    layer = st.fixed_dictionaries({}, optional={"quant_algo": st.sampled_from(["NVFP4", "FP8", "w4a16_nvfp4", "MXFP4"]) | json_values,
                                                "group_size": st.sampled_from([16, 32]) | json_values})
    section = st.fixed_dictionaries({"quant_algo": st.just("MIXED_PRECISION")}, optional={
        "quantized_layers": st.dictionaries(st.text(max_size=12), layer | json_values, max_size=3) | json_values,
        "config_groups": json_values, "ignore": json_values, "exclude_modules": json_values, "kv_cache_scheme": json_values,
        "kv_cache_quant_algo": json_values, "quant_method": st.just("modelopt") | json_values})

    @settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
    @given(cfg=st.none() | section, hf=st.none() | section)
    def run(cfg, hf):
        ckpt = Checkpoint(root=Path("ckpt"), shards=(), index_name=None, index=None,
                          config={"quantization_config": cfg} if cfg is not None else {},
                          hf_quant_config={"quantization": hf} if hf is not None else None, other_files=())
        try:
            d = formats.detect(ckpt).read_declaration(ckpt)
        except RepairError:
            return
        if d.layer_algos is not None:
            for name, _ in d.layer_algos.entries:
                assert d.algorithm(name) in ("NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "FP8")

    run()
