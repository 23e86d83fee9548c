"""The shipped `dropped_in_layers` of sglang-0.5.23.json is what SGLang 0.5.23's own DeepSeek-V4 model builds.

Regenerated here from SGLang's constructor (tools/sglang_layer_drops.py: the model built from the tiny published
config and again with compress_ratios rotated, each module's absent layers moving with the values), so a release
whose model builds its compressor or indexer in other layers fails here, not in a user's run.
"""

from __future__ import annotations

import json

import pytest

from tools.sglang_layer_drops import ARCH, generate

from .probe import REPO, SGLANG_VENV, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
SHIPPED = REPO / "repair" / "targets" / "data" / "sglang-0.5.23.json"


def test_shipped_layer_drops_are_sglangs_own():
    learned = generate(SGLANG_VENV)
    assert learned[ARCH]["layers.*.attn.compressor"] == {"where": "compress_ratios", "in": [0]}
    assert json.loads(SHIPPED.read_text())["rules"]["dropped_in_layers"] == learned
