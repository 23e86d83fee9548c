"""DeepSeek-V3.2 and GLM-5 (DeepSeek Sparse Attention) checkpoints are judged by vLLM 0.32's own build of them.

vLLM refuses to build a sparse-MLA layer on CPU (platforms/cpu.py:150); the profile generator builds them with a strict
stand-in (tools/vllm_gpu_stand_ins.py), and the tier loads their tiny exports in vLLM 0.32
(tests/vllm/test_generated_archs_vs_vllm.py -k "DeepseekV32 or GlmMoeDsa"). Here, without vLLM: the rows doctor uses
are those generated ones. vLLM builds the indexer's `wk` and `weights_proj` as one linear with quant_config=None
(models/deepseek_v2.py:712-716), so an NVFP4 export that stores either packed does not load there (the tier's broken
export), while the indexer's `wq_b` and the MLA projections take the quant config.
"""

from __future__ import annotations

import pytest

from repair import arch

VLLM = arch.newest("vllm")
DSA = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM")


@pytest.mark.parametrize("name", DSA)
@pytest.mark.parametrize("checkpoint,never", [
    ("model.layers.5.self_attn.indexer.wk", True),
    ("model.layers.5.self_attn.indexer.weights_proj", True),
    ("model.layers.5.mlp.gate", True),  # the router: GateLinear, no quant config
    ("model.layers.5.self_attn.indexer.wq_b", False),
    ("model.layers.5.self_attn.q_a_proj", False),
    ("model.layers.5.self_attn.kv_b_proj", False),
])
def test_the_dsa_indexer_is_judged_by_vllms_own_build(name, checkpoint, never):
    assert name in VLLM.entries, sorted(VLLM.unprofiled)
    row = arch.architecture({"architectures": [name]})
    assert row not in arch.ARCHITECTURES, row.name  # the generated row, no hand table
    covered = [r.name for r in row.unquantized_roles if r.covers(checkpoint, "modelopt-nvfp4", "NVFP4")]
    assert bool(covered) == never, covered
