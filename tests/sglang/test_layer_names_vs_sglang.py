"""The shipped `layer_names` of sglang-0.5.23.json are SGLang's own (#28, sglang#24927).

They are regenerated here from SGLang's own load of every real-config fixture (tools/sglang_layer_names.py: the
prefix each layer's constructor asks the quant config about, and, for a fused layer, the shard name is_layer_skipped
makes from it for the shard id its loader got). Whether doctor and fix use them right is shown by SGLang loading fix's
output of Gemma 4's `.linear` layout (tests/sglang/test_fix_loads_in_sglang.py).
"""

from __future__ import annotations

import json

import pytest

from tools.sglang_layer_names import generate

from .probe import REPO, SGLANG_VENV, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
SHIPPED = REPO / "repair" / "targets" / "data" / "sglang-0.5.23.json"


def test_shipped_layer_names_are_sglangs_own():
    generated = generate(SGLANG_VENV)
    assert "Gemma4ForConditionalGeneration" in generated  # the vision tower's fused q/k/v and gate/up
    assert json.loads(SHIPPED.read_text())["rules"]["layer_names"] == generated
