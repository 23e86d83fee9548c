"""SGLang 0.5.23 builds DeepSeek-V4's compressor and indexer only in the layers its compress_ratios give one.

Its attention (models/deepseek_v4.py:1449-1476) builds `compressor` where the layer's ratio is 4 or 128 and `indexer`
where it is 4; a ratio-0 layer has neither. Layer rows lent from vLLM 0.32 are not SGLang's loader (doctor/missing.py
own_loader), so doctor read the published layout's ratio-0 layers as having lost their compressors (10 errors on the
nvidia layout). The release's own rule is generated from SGLang's build (tools/sglang_layer_drops.py: its model built
again with the list rotated, tools/vllm_layer_facts.py where_rules) and applied by arch/layer_rules.py; a compressor
lost where the ratio builds one stays an error. The SGLang tier regenerates the block (tests/sglang/test_dsv4_drops_vs_sglang.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tools import dsv4_fp8_fixture
from tests.conftest import run_captured

SGLANG = "sglang==0.5.23"
DATA = Path(__file__).resolve().parents[1] / "repair" / "targets" / "data" / "sglang-0.5.23.json"
NVIDIA = dsv4_fp8_fixture.REAL.parent / "hf_quant_config.json"
PUBLISHED_RATIOS = json.loads(dsv4_fp8_fixture.REAL.read_text())["compress_ratios"]  # 43 layers: 0, 0, 4, 128, ... 4, 0
COMPRESSOR = ("", ".norm", ".wgate", ".wkv")


def nvidia_modelopt(folder: Path, ratios: list[int] | None = None, lose: str | None = None) -> Path:
    """The published tensors (tools/dsv4_fp8_fixture.py) under nvidia's ModelOpt hf_quant_config.json, config.json
    without its `fp8` quantization_config; `ratios`: compress_ratios (and depth); `lose`: a module whose tensors go."""
    def edit(tensors):
        for name in [n for n in tensors if lose and n.startswith(f"{lose}.")]:
            del tensors[name]

    if ratios is None:
        dsv4_fp8_fixture.write(folder, edit=edit)
    else:
        config = dsv4_fp8_fixture.config() | {"num_hidden_layers": len(ratios), "compress_ratios": ratios}
        folder.mkdir(parents=True)
        stored = dsv4_fp8_fixture.tensors(config)
        edit(stored)
        from safetensors.torch import save_file
        save_file(stored, str(folder / "model.safetensors"), metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config))
    config = json.loads((folder / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copy(NVIDIA, folder / "hf_quant_config.json")
    return folder


def missing(capsys, folder: Path, target: str = SGLANG) -> list[str]:
    code, out, err = run_captured(capsys, "doctor", str(folder), "--target", target, "--json")
    assert code in (0, 1), err
    return [f["subject"] for f in json.loads(out)["findings"] if f["code"] == "missing-module"]


def test_the_release_records_where_it_builds_no_compressor():
    rules = json.loads(DATA.read_text())["rules"]["dropped_in_layers"]["DeepseekV4ForCausalLM"]
    assert rules["layers.*.attn.compressor"] == {"where": "compress_ratios", "in": [0]}
    assert rules["layers.*.attn.indexer.wq_b"][0] == {"where": "compress_ratios", "in": [0, 128]}  # then V4.1's lists


def test_no_compressor_is_missing_where_the_ratio_builds_none(capsys, tmp_path):
    assert missing(capsys, nvidia_modelopt(tmp_path / "tiny")) == []


@pytest.fixture(scope="module")
def published_depth(tmp_path_factory) -> Path:
    return nvidia_modelopt(tmp_path_factory.mktemp("dsv4") / "published", PUBLISHED_RATIOS)


def test_the_published_depth_has_no_compressor_missing(capsys, published_depth):
    assert missing(capsys, published_depth) == []


def test_a_compressor_lost_in_a_ratio_4_layer_is_still_missing(capsys, tmp_path):
    assert PUBLISHED_RATIOS[2] == 4
    lost = nvidia_modelopt(tmp_path / "lost", PUBLISHED_RATIOS, lose="layers.2.attn.compressor")
    assert missing(capsys, lost) == [f"layers.2.attn.compressor{leaf}" for leaf in COMPRESSOR]
