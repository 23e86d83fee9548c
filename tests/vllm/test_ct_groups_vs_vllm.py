"""compressed-tensors config groups of different schemes: doctor's per-layer scheme is vLLM 0.32's own decision.

vLLM's side: its CompressedTensorsConfig.from_config(the case's quantization_config).get_scheme_dict(layer, prefix)
(tools/ct_groups_probe.py), for the real RedHatAI DeepSeek-V4-Flash NVFP4+FP8 config at the prefixes vLLM 0.32's
DeepSeek-V4 builds (models/deepseek_v4: fused_wqa_wkv, wq_b, wo_a, wo_b, ffn ...) and for re-targeted cases where first
match, group order, a target in two groups, fused shards and a class-name target decide (tests/ct_group_cases.py).
doctor's side: the declaration `--target vllm==0.32.0` reads, asked `algorithm(prefix, packed)`.
"""

from __future__ import annotations

import pytest

from tests.ct_group_cases import answers, test_each_layers_scheme_is_the_runtimes  # noqa: F401  (the shared tier test)

from .probe import VLLM_PY, requires_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
RUNTIME, RUNTIME_PY, TARGET = "vllm", VLLM_PY, "vllm==0.32.0"
