"""The profile's per-layer rules carry over to a published config's depth, judged by vLLM 0.32's own load_weights.

The generator fits Gemma 3n's KV-shared drop (k_proj/v_proj/k_norm in the last `num_kv_shared_layers` layers) on a
4-layer config. Here vLLM builds Gemma3nForCausalLM with 7 layers, 3 of them KV-shared (tools/vllm_layer_facts.py),
and says where it drops each checkpoint module; repair's expansion of the shipped rule for that config must name
exactly those layers.
"""

from __future__ import annotations

import json
import re

import pytest

from repair import arch
from repair.targets.profiles import release_at_or_below

from .probe import requires_vllm
from .test_profiles_vs_vllm import SHIPPED, in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
ARCH = "Gemma3nForCausalLM"


def test_gemma3n_kv_shared_rule_at_another_depth(tmp_path):
    kinds = ["sliding_attention", "sliding_attention", "full_attention"] * 2 + ["sliding_attention"]
    overrides = {"num_hidden_layers": 7, "num_kv_shared_layers": 3, "layer_types": kinds,
                 "intermediate_size": [128] * 7, "activation_sparsity_pattern": [0.95] * 6 + [0.0],
                 "_refused": json.loads(SHIPPED.read_text())["architectures"][ARCH]["nvfp4_refused"]}
    (tmp_path / "overrides.json").write_text(json.dumps(overrides))
    [vllm_drops] = in_vllm("vllm_layer_facts.py", ARCH, tmp_path / "overrides.json")
    config = {k: v for k, v in overrides.items() if not k.startswith("_")} | {"architectures": [ARCH]}
    ours: dict[str, list[int]] = {}
    for name in arch.architecture(config, release_at_or_below("vllm", (0, 32, 0))).dropped(config):
        stack, layer, rest = re.fullmatch(r"(.+?\.layers)\.(\d+)\.(.+)", name).groups()
        ours.setdefault(f"{stack}.*.{rest}", []).append(int(layer))
    assert {m: sorted(v) for m, v in ours.items()} == vllm_drops
    assert vllm_drops == {f"model.layers.*.self_attn.{m}": [4, 5, 6] for m in ("k_norm", "k_proj", "v_proj")}
