"""vLLM 0.28/0.30's Kimi-Linear rows against the model a published Kimi-Linear config builds.

vLLM 0.28 and 0.30 read Kimi-Linear's config.json with their own KimiLinearConfig
(transformers_utils/configs/kimi_linear.py): its layers come from `linear_attn_config` (kda_layers / full_attn_layers,
None: every layer MLA) and `first_k_dense_replace` (default 0: every layer MoE), the fields the published config
(moonshotai/Kimi-Linear-48B-A3B-Instruct) writes. transformers 5.25's KimiLinearConfig writes neither: it writes
`layer_types` and `mlp_layer_types`, which vLLM's class ignores. Measured in /work/venvs/vllm-0.28 (the profile's
build, tools/vllm_profile.py built_from) on the profile's small config and on the same config in the published form
(first_k_dense_replace 1, linear_attn_config kda_layers [1, 2, 3], full_attn_layers [4]): the first builds only MLA +
MoE layers (the shipped row); the second also layer 0's dense `mlp.gate_up_proj`/`mlp.down_proj` (kimi_k3/nvidia/
model.py:915-935) and the KDA layers' `self_attn.in_proj_qkvgfab`, `f_b_proj`, `g_a_proj`, `g_b_proj`. The profile's
small config now writes both fields in the published form (tools/vllm_small_extras.py EXTRA).
"""

from __future__ import annotations

import pytest

from repair import arch

ARCH = "KimiLinearForCausalLM"
# module patterns vLLM 0.28 builds for the published form and the row built from transformers' form lacked (measured)
PUBLISHED_ONLY = ("model.layers.*.mlp.gate_up_proj", "model.layers.*.mlp.down_proj",
                  "model.layers.*.self_attn.in_proj_qkvgfab", "model.layers.*.self_attn.f_b_proj",
                  "model.layers.*.self_attn.g_a_proj", "model.layers.*.self_attn.g_b_proj")


def row(release: tuple[int, ...]):
    [profile] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.release == release]
    return profile.entries[ARCH]


@pytest.mark.parametrize("release", [(0, 28, 0), (0, 30, 0)])
def test_the_row_holds_the_layers_a_published_config_builds(release):
    """Failed before tools/vllm_profile_configs.py wrote linear_attn_config and first_k_dense_replace (the row was
    every layer MLA + MoE); 0.30's row, regenerated the same way, equals 0.28's."""
    modules = row(release)["modules"]
    assert not [m for m in PUBLISHED_ONLY if m not in modules], sorted(modules)


@pytest.mark.parametrize("release", [(0, 28, 0), (0, 30, 0)])
def test_the_row_holds_the_load_facts_vllms_load_weights_gives(release):
    """Failed before: tools/vllm_load_facts.py placed_weights swallowed vLLM's KeyError on the one name of
    transformers' save it has no parameter for (layer 0's dense MLP saved as `block_sparse_moe.*`: kimi_k3/nvidia/
    model.py looks it up in params_dict) and recorded nothing placed, so the row had no prefixes and no loads_into.
    Each module fed alone, the KDA layer's q/k/v, f_a and b projections load into `in_proj_qkvgfab` (the prefix vLLM
    asks the quant config about) and the refused names are recorded with vLLM's line."""
    entry = row(release)
    assert entry["prefixes"]["model.layers.*.self_attn.q_proj"] == "model.layers.*.self_attn.in_proj_qkvgfab", entry
    assert entry["loads_into"]["model.layers.*.self_attn.q_conv1d"] == "model.layers.*.self_attn.conv1d", entry
    refused = entry["weight_refused"]
    assert sorted(refused) == [f"model.layers.*.block_sparse_moe.{p}_proj" for p in ("down", "gate", "up")], refused
    # the refused name's layer number as `*` (tools/vllm_load_facts.py refusal_text): doctor puts the stored one back
    assert all(why.startswith("KeyError: 'layers.*.block_sparse_moe.") and "kimi_k3/nvidia/model.py:" in why
               for why in refused.values()), refused
