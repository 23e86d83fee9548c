"""The real-layout fixtures' activation scales are what a producer writes: fused siblings (q/k/v, gate/up), which read
one input tensor, carry one input scale (ModelOpt 0.47 `preprocess_linear_fusion` gives the group its max amax;
a calibrator observing one tensor sees one range). Random per-module draws made TensorRT-LLM's fused loader raise
`The input_scale should be same for all the weights` on a healthy ct-laguna-moe export."""

from __future__ import annotations

import pytest
from safetensors.torch import load_file

from tools.real_fixture import REAL_MODELS, input_group, real_weight_map, write_llama, write_real_model

INPUT_LEAVES = ("input_scale", "input_global_scale")


def _scales_by_group(tensors) -> dict[str, set[float]]:
    groups: dict[str, set[float]] = {}
    for name, t in tensors.items():
        module, _, leaf = name.rpartition(".")
        if leaf in INPUT_LEAVES and t.numel() == 1:
            groups.setdefault(input_group(module), set()).add(t.item())
    return groups


@pytest.mark.parametrize("key", sorted(REAL_MODELS))
def test_fused_siblings_share_one_input_scale(tmp_path, key):
    tensors = load_file(write_real_model(tmp_path / key, key) / "model.safetensors")
    groups = _scales_by_group(tensors)
    fused = {g: v for g, v in groups.items() if g.endswith((".qkv", ".gate_up"))}
    assert fused, "no fused sibling group has an input scale"
    assert all(len(v) == 1 for v in fused.values()), {g: v for g, v in fused.items() if len(v) > 1}
    assert len({v.pop() for v in groups.values()}) > len(groups) // 2, "groups no longer draw their own scales"


def test_the_published_layout_fixture_shares_them_too(tmp_path):
    from tools.layout_fixture import write_layout

    groups = _scales_by_group(load_file(write_layout(tmp_path / "glm", "modelopt-glm4-moe") / "model.safetensors"))
    assert all(len(v) == 1 for g, v in groups.items() if g.endswith((".qkv", ".gate_up"))) and len(groups) > 10


def test_the_llama_layout_fixture_shares_them_too(tmp_path):
    weight_map = real_weight_map("llama-3.1-8b-instruct-fp4")
    folder = write_llama(tmp_path / "llama", "llama-3.1-8b-instruct-fp4", weight_map)
    tensors = {}
    for shard in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(shard))
    groups = _scales_by_group(tensors)
    assert all(len(v) == 1 for g, v in groups.items() if g.endswith((".qkv", ".gate_up"))) and len(groups) > 10
