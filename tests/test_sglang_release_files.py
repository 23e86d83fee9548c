"""SGLang 0.5.13-0.5.22 each have their own rules file, read from their own wheel (before, they fell back to 0.5.12's).

Where the wheels are at hand (/tmp/sglwheels/0.5.X, `pip download --no-deps sglang==0.5.X`), each shipped file is what
the generators read from its wheel: tools/sglang_rules_data.py's rules (the RULES row, its markers checked against the
wheel; a `same_as` row only where every RULE_CODE unit is the previous release's ast), and the blocks of
tools/sglang_moe_schemes.py, sglang_linear_schemes.py, sglang_sparse24.py, sglang_moe_overrides.py,
sglang_expert_scales.py (which stops on 0.5.14-0.5.22: no block, no claim) and sglang_config_types.py (where the
transformers wheel each release pins is at hand). Without the wheels these skip, as on CI. The behaviour tests run
everywhere: a rule that changed between two releases is judged per release.
"""

from __future__ import annotations

import glob
import json
import zipfile
from pathlib import Path

import pytest

from repair.targets.runtime_rules import shipped_rules
from tests.conftest import run_captured

WHEELS = {Path(p).name.split("-")[1]: Path(p) for p in glob.glob("/tmp/sglwheels/0.5.*/sglang-*.whl")}
NEW = [f"0.5.{n}" for n in range(13, 23)]
DATA = Path(__file__).resolve().parents[1] / "repair" / "targets" / "data"


def shipped(release: str) -> dict:
    return json.loads((DATA / f"sglang-{release}.json").read_text(encoding="utf-8"))


def wheel(release: str) -> Path:
    if release not in WHEELS:
        pytest.skip(f"no SGLang {release} wheel at /tmp/sglwheels/{release}")
    return WHEELS[release]


def test_every_release_0_5_9_to_0_5_23_ships_its_own_file():
    labels = {r.label for r in shipped_rules() if r.runtime == "sglang"}
    assert labels == {f"sglang 0.5.{n}" for n in range(9, 24)}, sorted(labels)


@pytest.mark.parametrize("release", NEW)
def test_the_rules_are_what_sglang_rules_data_reads_from_the_wheel(release):
    from tools.sglang_rules_data import GENERATED_FROM_INSTALLED, profile

    doc = json.loads(json.dumps(profile(wheel(release), dict(WHEELS))))  # as written: tuples become lists
    own = shipped(release)
    assert doc["source"] == own["source"], release
    kept = {k: v for k, v in own["rules"].items() if k not in GENERATED_FROM_INSTALLED}
    assert doc["rules"] == kept, sorted(k for k in kept if doc["rules"].get(k) != kept[k])


@pytest.mark.parametrize("release", NEW)
@pytest.mark.parametrize("tool,key", [("sglang_moe_schemes", "moe_scheme_refused"),
                                      ("sglang_linear_schemes", "linear_scheme_refused"),
                                      ("sglang_sparse24", "sparse_24_refused"),
                                      ("sglang_moe_overrides", "moe_backend_overrides")])
def test_each_wheel_block_is_what_its_generator_reads(release, tool, key):
    import importlib

    read_wheel = importlib.import_module(f"tools.{tool}").read_wheel
    got_release, digest, block = read_wheel(wheel(release))
    own = shipped(release)
    assert (got_release, digest) == (release, own["source"]["sha256"])
    assert own["rules"][key] == block, (release, key)


@pytest.mark.parametrize("release", NEW)
def test_the_expert_scale_block_is_read_where_the_generator_runs_clean_and_absent_where_it_stops(release):
    """0.5.13's ModelOpt NVFP4 MoE keeps the gate's global scale on every backend (0.5.12's shape); 0.5.21/0.5.22's picks
    by MoE runner backend as 0.5.23's does (their server args' SM120 default read). 0.5.14-0.5.20's method is a third
    shape (the tool finds a marlin branch only, and the server args pick flashinfer_cutlass; 0.5.14 has no
    arg_groups/overrides.py): the tool stops, so the file claims nothing about the expert scales."""
    from tools.sglang_expert_scales import read_wheel

    own = shipped(release)["rules"]
    path = wheel(release)
    if release in ("0.5.13", "0.5.21", "0.5.22"):
        assert read_wheel(path)[2] == own["experts_gate_up_scale_2"]
        return
    with pytest.raises(SystemExit, match="read"):
        read_wheel(path)
    assert "experts_gate_up_scale_2" not in own, release


@pytest.mark.parametrize("release", NEW)
def test_the_config_model_types_are_read_from_the_wheel_and_the_transformers_it_pins(release):
    from tools import sglang_config_types

    path = wheel(release)
    with zipfile.ZipFile(path) as whl:
        pinned = sglang_config_types.pinned_transformers(whl)
    if not list((sglang_config_types.TRANSFORMERS_WHEELS / pinned).glob("transformers-*.whl")):
        pytest.skip(f"no transformers {pinned} wheel at {sglang_config_types.TRANSFORMERS_WHEELS / pinned}")
    assert sglang_config_types.facts(path) == shipped(release)["rules"]["config_model_types"], release


def test_a_release_whose_rule_code_is_the_previous_ones_is_same_as_and_no_other():
    """RULE_CODE, unit by unit (ast): where a release's is the previous release's, its RULES row is `same_as` that one
    (0.5.12 is 0.5.11's); every other release has a row of its own (0.5.13-0.5.22 all differ from the release before)."""
    from tools.sglang_rules_data import rule_code
    from tools.sglang_rules_table import RULES

    releases = sorted(WHEELS, key=lambda r: tuple(map(int, r.split("."))))
    if len(releases) < 2:
        pytest.skip("fewer than two SGLang wheels at /tmp/sglwheels")
    codes = {}
    for release in releases:
        with zipfile.ZipFile(WHEELS[release]) as whl:
            codes[release] = rule_code(whl)
    for before, release in zip(releases, releases[1:]):
        same = codes[before] == codes[release]
        assert (RULES[release].get("same_as") == before) == same, (release, before, same)


def test_every_rule_code_unit_is_in_the_newest_wheel():
    """A unit named wrong reads as 'absent' in every wheel, so it never differs: model_config.py's methods were named
    without their class (`_parse_modelopt_quant_config`, not `ModelConfig._parse_modelopt_quant_config`) and no
    same_as check compared them."""
    from tools.sglang_rules_data import rule_code

    with zipfile.ZipFile(wheel("0.5.23")) as whl:
        absent = sorted(k for k, v in rule_code(whl).items() if v == "absent")
    assert absent == [], absent


def test_a_trailing_dot_or_a_parent_entry_is_judged_by_each_releases_own_reading():
    """ModelOpt: _module_path_match strips a trailing `.` from 0.5.13 (0.5.13 quantization/utils.py:53-54), not 0.5.12.
    compressed-tensors: should_ignore_layer's plain entry is a case-insensitive substring to 0.5.16 and the name or a
    dotted suffix from 0.5.17 (0.5.17 compressed_tensors/utils.py check_equal_or_regex_match), so the parent entry
    llm-compressor writes (`model.layers.0.mlp`) ignores layer 0's down_proj for 0.5.16 and not for 0.5.17."""
    from tests.test_runtime_sglang_match import QWEN3_MOE, sglang

    matchers = {r.label: r.matchers for r in shipped_rules() if r.runtime == "sglang"}
    entry, prefix = ["model.layers.0.self_attn."], "model.layers.0.self_attn.o_proj"
    for n in range(11, 24):
        assert sglang(entry, matchers[f"sglang 0.5.{n}"]["modelopt"]).excludes(prefix) is (n >= 13), n
    from repair.targets.matchers import exclusion_matcher

    for n in range(9, 24):
        rule = exclusion_matcher(matchers[f"sglang 0.5.{n}"]["compressed-tensors"])(("model.layers.0.mlp",), None, QWEN3_MOE)
        assert rule.excludes("model.layers.0.mlp.down_proj") is (n <= 16), n


def test_a_quantized_layers_key_in_the_other_vl_spelling_is_found_from_0_5_15_and_model_dot_from_0_5_20():
    """_resolve_quant_algo asks _quantized_layer_prefix_candidates from 0.5.15 (lm_head, `language_model.model.` <->
    `model.language_model.`); 0.5.20 adds `model.` -> `model.language_model.` (0.5.20 modelopt_quant.py)."""
    from repair.formats.algorithms import LayerAlgorithms
    from repair.targets.matchers import layer_matcher
    from tests.test_runtime_sglang_match import QWEN3_MOE

    layers = LayerAlgorithms((("model.language_model.layers.0.self_attn.o_proj", "FP8"),))
    matchers = {r.label: r.matchers["quantized_layers"] for r in shipped_rules() if r.runtime == "sglang"}
    for n in range(10, 24):
        lookup = layer_matcher(matchers[f"sglang 0.5.{n}"])
        swapped = lookup(layers, "language_model.model.layers.0.self_attn.o_proj", QWEN3_MOE)[0]
        plain = lookup(layers, "model.layers.0.self_attn.o_proj", QWEN3_MOE)[0]
        assert (swapped, plain) == ("FP8" if n >= 15 else None, "FP8" if n >= 20 else None), n


@pytest.mark.parametrize("release,refused", [("0.5.12", False), ("0.5.18", True), ("0.5.19", False)])
def test_a_w4a16_nvfp4_modelopt_checkpoint_is_refused_by_the_releases_whose_from_config_refuses_it(
        capsys, tmp_path, release, refused):
    """ModelOptFp4Config.from_config raises for a quant_algo outside its list: W4A16_NVFP4 joins it in 0.5.19 (0.5.18
    modelopt_quant.py lists FP8, NVFP4, NVFP4_AWQ). 0.5.12's file does not record its own refusal (its row predates
    this reading; left as it was)."""
    from tools.real_fixture import write_real_model

    src = write_real_model(tmp_path / "m", "qwen3-32b")
    hf = json.loads((src / "hf_quant_config.json").read_text())
    hf["quantization"]["quant_algo"] = "W4A16_NVFP4"
    (src / "hf_quant_config.json").write_text(json.dumps(hf))
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    (src / "config.json").write_text(json.dumps(config))
    code, text, err = run_captured(capsys, "doctor", src, "--target", f"sglang=={release}", "--json")
    errors = [f["runtime_error"] for f in json.loads(text)["findings"] if f["subject"] == "hf_quant_config.json"]
    assert bool(errors and "only supports: FP8, NVFP4, NVFP4_AWQ quantizations" in errors[0]) is refused, (release, errors)


@pytest.mark.parametrize("release", ["0.5.10", "0.5.12", "0.5.13", "0.5.14"])
@pytest.mark.parametrize("how", ["architecture", "model_type"])
def test_a_nemotron_h_mixed_precision_checkpoint_is_not_called_w4afp8(capsys, tmp_path, release, how):
    """0.5.10-0.5.14 model_config.py _parse_modelopt_quant_config reads MIXED_PRECISION as w4afp8 except for NemotronH
    (`model_type == "nemotron_h"` or an architecture starting `NemotronH`: 0.5.13 model_config.py:1022-1028), which
    it reads as modelopt_mixed (nvidia's Nemotron-3 NVFP4 exports are MIXED_PRECISION). The files' refusal is one
    entry per quant_algo, whatever the class: doctor told a NemotronH user SGLang reads it as w4afp8. Either test
    alone spares it; any other class (the same config, Qwen3.5's) is still read as w4afp8."""
    from tools.real_fixture import write_qwen36

    folder = write_qwen36(tmp_path / "nemotron")
    config = json.loads((folder / "config.json").read_text())
    code, text, err = run_captured(capsys, "doctor", folder, "--target", f"sglang=={release}", "--json")
    assert any("w4afp8" in f["message"] for f in json.loads(text)["findings"]), release
    config.update(architectures=["NemotronHForCausalLM"]) if how == "architecture" else config.update(model_type="nemotron_h")
    (folder / "config.json").write_text(json.dumps(config))
    code, text, err = run_captured(capsys, "doctor", folder, "--target", f"sglang=={release}", "--json")
    assert not any("w4afp8" in f["message"] for f in json.loads(text)["findings"]), release
