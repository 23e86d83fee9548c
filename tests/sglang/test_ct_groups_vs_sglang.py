"""compressed-tensors config groups of different schemes: doctor's per-layer scheme for sglang==0.5.23 is SGLang's.

SGLang's side: its CompressedTensorsConfig.from_config(the case's quantization_config).get_scheme_dict(layer, prefix)
(tools/ct_groups_probe.py; SGLang tries a class-name target before fused shards, and raises "Unable to find matching
target" for a layer no target matches). doctor's side: the declaration `--target sglang==0.5.23` reads: the algorithm
per prefix, and for a layer SGLang refuses, the refusal the bound rule predicts with SGLang's words.
"""

from __future__ import annotations

import pytest

from tests.ct_group_cases import answers, test_each_layers_scheme_is_the_runtimes  # noqa: F401  (the shared tier test)

from .probe import SGLANG_PY, TARGET, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
RUNTIME, RUNTIME_PY = "sglang", SGLANG_PY
