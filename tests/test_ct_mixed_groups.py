"""compressed-tensors configs whose config groups have different schemes (FP8 block + NVFP4): read per layer.

The real config is RedHatAI/DeepSeek-V4-Flash-NVFP4-FP8's (tests/data/real/, PROVENANCE.md): group_0 FP8 block
128x128 for attention projections, group_1 NVFP4 for the FFN and expert projections. vLLM 0.32 and SGLang 0.5.23
(CompressedTensorsConfig.get_scheme_dict / find_matched_target) give a layer not ignored the scheme of the first
target that matches it; tests/vllm/test_ct_groups_vs_vllm.py and tests/sglang/test_ct_groups_vs_sglang.py ask their
own functions the same cases (CASES).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from repair import formats
from repair.formats.ct_groups import ORDERS
from repair.io.checkpoint import open_checkpoint
from tests.conftest import read_json, run_captured
from tests.ct_group_cases import CASES, ORDER_CASE, case_config, quantization_config

REAL = Path(__file__).parent / "data" / "real" / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json"


def write(folder: Path, quantization_config: dict, tensors: dict | None = None) -> Path:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    config = read_json(REAL)
    config["quantization_config"] = quantization_config
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tensors or {"x.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    return folder


def declaration(folder: Path):
    ckpt = open_checkpoint(folder)
    return formats.detect(ckpt).read_declaration(ckpt)


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_layer_gets_the_first_matching_targets_scheme(tmp_path, case):
    config, layers = case_config(case), CASES[case][1]
    d = declaration(write(tmp_path / case, config))
    got = {prefix: d.algorithm(prefix, {k: tuple(v) for k, v in CASES[case][2].items()}) for prefix in layers}
    assert got == layers


def test_vllm_tries_fused_shards_before_class_names_and_sglang_after(tmp_path):
    groups, prefix, expected = ORDER_CASE
    d = declaration(write(tmp_path / "order", quantization_config(groups, [])))
    packed = {"qkv_proj": ("q_proj", "k_proj", "v_proj")}
    assert d.algorithm(prefix, packed) == expected["vllm"]
    assert d.group_algos.ordered(ORDERS["sglang"]).resolve(prefix, packed) == expected["sglang"]


def test_the_real_mixed_config_is_read_not_refused(capsys, tmp_path):
    src = write(tmp_path / "real", read_json(REAL)["quantization_config"])
    code, out, err = run_captured(capsys, "inspect", src)
    assert (code, err) == (0, "")
    d = declaration(src)
    assert d.algorithm("layers.3.attn.wq_b") == "FP8_BLOCK"
    assert d.algorithm("layers.3.ffn.experts.7.down_proj") == "NVFP4"
    assert d.algorithm("layers.3.ffn.gate") is None and d.algorithm("head") is None


@pytest.mark.parametrize("edit, said", [
    (lambda g: g["group_0"].update(format="int-quantized"), "int-quantized"),
    (lambda g: g["group_0"]["weights"].update(strategy="channel"), "float-quantized"),
    (lambda g: g["group_1"]["weights"].update(group_size=32), "nvfp4-pack-quantized"),
    (lambda g: g["group_0"]["weights"].update(block_structure=[64, 128]), "float-quantized"),
])
def test_a_group_scheme_the_tool_cannot_read_is_refused_in_one_line(capsys, tmp_path, edit, said):
    qc = copy.deepcopy(read_json(REAL)["quantization_config"])
    edit(qc["config_groups"])
    src = write(tmp_path / "bad", qc)
    code, _, err = run_captured(capsys, "inspect", src)
    assert code == 2 and err.count("\n") == 1 and said in err and "config_groups" in err, err
