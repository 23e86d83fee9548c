"""SGLang 0.5.23 builds DeepSeek-V4.1's compressor and indexer only in the layers its source lists name.

V4.1's `compress_ratios` take 1 and 2 besides 0; at those ratios its attention (models/deepseek_v4.py:1481-1497) builds
`DeepseekV41Compressor` only where the layer is in `kv_source_layer_ids` and `DeepseekV41Indexer` only where it is in
`index_source_layer_ids`, whose own keys (`wk`, `k_norm`) only a KV source has (dsv41_sparse.py:203,232). The ratio
rule learned from V4 (0, 4, 128) saw none of this: doctor expected the compressor of every ratio-1/2 layer like its
neighbours (generic layer gaps), 1 to 4 false errors on a V4.1 layout. The rule is generated from SGLang's own build of
a V4.1 config (tools/sglang_layer_drops.py) and applied by arch/layer_rules.py (`unless_listed`).

The fixture is V4.1-shaped (tools/dsv41_fixture.py) and lists `DeepseekV4ForCausalLM`, the class SGLang's config class
renames the published `DeepseekV41ForCausalLM` to (configs/deepseek_v41.py:38-39).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from repair.arch.layer_rules import dropped_modules, layer_drops
from tests.conftest import run_captured
from tests.test_sglang_dsv4_drops import DATA, NVIDIA, SGLANG, missing
from tools import dsv41_fixture

RULES = json.loads(DATA.read_text())["rules"]["dropped_in_layers"]["DeepseekV4ForCausalLM"]


def v41(folder: Path, layout: dict | None = None, lose: str | None = None) -> Path:
    """The V4.1 layout under nvidia's ModelOpt hf_quant_config.json, listing the class SGLang builds for it."""
    dsv41_fixture.write(folder, layout, lose)
    config = json.loads((folder / "config.json").read_text()) | {"architectures": ["DeepseekV4ForCausalLM"]}
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(NVIDIA, folder / "hf_quant_config.json")
    return folder


def test_the_release_records_the_source_lists():
    assert {"where": "compress_ratios", "in": [1, 2], "unless_listed": ["index_source_layer_ids", "kv_source_layer_ids"]} \
        in RULES["layers.*.attn.indexer.wk"]
    assert {"where": "compress_ratios", "in": [1, 2], "unless_listed": ["kv_source_layer_ids"]} in RULES["layers.*.attn.compressor.wkv"]
    assert {"where": "compress_ratios", "in": [1, 2], "unless_listed": ["index_source_layer_ids"]} in RULES["layers.*.attn.indexer.wq_b"]


def test_a_listed_layer_is_dropped_only_where_unlisted():
    drops = layer_drops("layers.*.attn.compressor", [{"where": "compress_ratios", "in": [0]},
                        {"where": "compress_ratios", "in": [1, 2], "unless_listed": ["kv_source_layer_ids"]}], "test")
    config = {"num_hidden_layers": 5, "compress_ratios": [0, 2, 2, 1, 4], "kv_source_layer_ids": [1, 3]}
    assert dropped_modules(drops, config) == {"layers.0.attn.compressor", "layers.2.attn.compressor"}


@pytest.mark.parametrize("hostile", [None, "1", [True], ["1"], [1.5], list(range(1 << 17))])
def test_a_hostile_source_list_drops_nothing(hostile):
    """A list that is not whole layer numbers (at most one per layer of the deepest stack read) proves nothing."""
    drops = layer_drops("layers.*.m", [{"where": "compress_ratios", "in": [1], "unless_listed": ["ids"]}], "test")
    assert dropped_modules(drops, {"num_hidden_layers": 2, "compress_ratios": [1, 1], "ids": hostile}) == set()


def test_the_indexers_keys_are_kept_where_both_lists_name_the_layer():
    drops = layer_drops("layers.*.wk", [{"where": "compress_ratios", "in": [1], "unless_listed": ["a", "b"]}], "test")
    config = {"num_hidden_layers": 3, "compress_ratios": [1, 1, 1], "a": [0, 1], "b": [1, 2]}
    assert dropped_modules(drops, config) == {"layers.0.wk", "layers.2.wk"}


def test_a_listed_number_past_the_stack_lists_no_layer():
    drops = layer_drops("layers.*.m", [{"where": "compress_ratios", "in": [1], "unless_listed": ["ids"]}], "test")
    assert dropped_modules(drops, {"num_hidden_layers": 2, "compress_ratios": [1, 1], "ids": [-1, 7, 1]}) == {"layers.0.m"}


def test_no_v41_compressor_is_missing_where_its_lists_build_none(capsys, tmp_path):
    assert missing(capsys, v41(tmp_path / "tiny")) == []


def test_the_published_v41_layout_has_none_missing(capsys, tmp_path):
    assert missing(capsys, v41(tmp_path / "published", dsv41_fixture.PUBLISHED)) == []


@pytest.mark.parametrize("layer", [8, 20])  # ratio 2, ratio 1
def test_a_kv_source_losing_its_compressor_is_still_missing(capsys, tmp_path, layer):
    """Its norm and wkv, which the other KV sources store (the ratio-2 wgate, stored by two layers of four, is more
    than the generic layer-gap rule of doctor/missing.py calls a gap: not said)."""
    lost = v41(tmp_path / "lost", dsv41_fixture.PUBLISHED, lose=f"layers.{layer}.attn.compressor")
    assert missing(capsys, lost) == [f"layers.{layer}.attn.compressor{leaf}" for leaf in (".norm", ".wkv")]


def test_the_published_class_name_is_built_as_sglang_renames_it(capsys, tmp_path):
    """config.json lists `DeepseekV41ForCausalLM`, which SGLang registers no class of; its config class writes
    `DeepseekV4ForCausalLM` over it (its data's `registry_renamed`), so the model is built and judged by its rules:
    no unregistered-architecture error (there was one, and the generic layer gaps' 1 false missing module)."""
    folder = dsv41_fixture.write(tmp_path / "v41", dsv41_fixture.PUBLISHED)
    shutil.copy(NVIDIA, folder / "hf_quant_config.json")
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["DeepseekV41ForCausalLM"]
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", SGLANG, "--json")
    codes = [f["code"] for f in json.loads(out)["findings"]]
    assert "unregistered-architecture" not in codes and "missing-module" not in codes, codes


@pytest.mark.parametrize("listed, model_type", [(["DeepseekV41ForCausalLM", "X"], "deepseek_v41"),
                                                (["DeepseekV41ForCausalLM"], "deepseek_v4"), (["DeepseekV41ForCausalLM"], 7)])
def test_only_what_the_config_class_was_seen_to_rename_is_renamed(listed, model_type):
    """A list of two names, or another model_type's class (hostile: not a string), renames nothing."""
    from repair.arch.registry import resolve
    from repair.targets.profiles import resolve as target

    registry = target(SGLANG).profile.rules.model_registry
    assert resolve({"architectures": listed, "model_type": model_type}, registry).name != "DeepseekV4ForCausalLM"


def test_an_entry_past_the_decoder_changes_no_layer_it_drops():
    """SGLang and vLLM read `compress_ratios[layer_id]` (SGLang models/deepseek_v4.py:1044-1047; vLLM 0.32
    models/deepseek_v41/attention.py:312, deepseek_v4/attention.py:233): a longer list builds as its first `depth`."""
    drops = layer_drops("layers.*.m", [{"where": "compress_ratios", "in": [0]}], "test")
    assert dropped_modules(drops, {"num_hidden_layers": 2, "compress_ratios": [0, 4, 0]}) == {"layers.0.m"}
    assert dropped_modules(drops, {"num_hidden_layers": 2, "compress_ratios": [0]}) == set()  # short: nothing proven


def test_a_v41_list_longer_than_the_decoder_has_none_missing(capsys, tmp_path):
    """SGLang 0.5.23 builds the tiny V4.1 layout with one more ratio-1 entry exactly as without it (its own build,
    tools/sglang_layer_drops.py --unbuilt, measured); doctor said the ratio-1 KV source's wgate was missing."""
    folder = v41(tmp_path / "long", dsv41_fixture.PUBLISHED)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"compress_ratios": config["compress_ratios"] + [1]}))
    assert missing(capsys, folder) == []


def test_a_config_class_that_writes_a_list_where_none_is_given_is_read_so():
    """SGLang 0.5.23's Olmo3Config writes `["Olmo2ForCausalLM"]` when config.json has no `architectures`
    (configs/olmo3.py:61-62) and builds Olmo2ForCausalLM; doctor said SGLang raises TypeError on the missing list."""
    from repair.arch.registry import resolve
    from repair.targets.profiles import resolve as target

    registry = target(SGLANG).profile.rules.model_registry
    assert resolve({"model_type": "olmo3"}, registry).name == "Olmo2ForCausalLM"
    assert resolve({"model_type": "olmo3", "architectures": []}, registry).name != "Olmo2ForCausalLM"  # [] kept
    assert resolve({"model_type": "olmo3", "architectures": [""]}, registry).name != "Olmo2ForCausalLM"  # a name ""
