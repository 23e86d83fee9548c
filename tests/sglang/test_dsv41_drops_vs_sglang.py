"""doctor's reading of DeepSeek-V4.1's layers is what SGLang 0.5.23's own model builds at the published layout.

The rule in sglang-0.5.23.json was learned from a tiny 8-layer V4.1 build (tools/sglang_layer_drops.py listed_rules);
here SGLang builds the published 40-layer layout (tools/dsv41_fixture.py PUBLISHED: ratios 0, 0, 2 x 18, 1 x 20; KV
sources 2, 8, 14, 20; index sources those and 24-36 by 4), and, for every module the rule names, the layers doctor's
rule drops it in (arch/layer_rules.py) are the layers SGLang's model has no parameter of it in.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.arch.layer_rules import dropped_modules, layer_drops
from tools import dsv41_fixture
from tools.sglang_layer_drops import ARCH, in_sglang, write_plain

from .probe import REPO, SGLANG_VENV, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
SHIPPED = REPO / "repair" / "targets" / "data" / "sglang-0.5.23.json"


def test_the_published_v41_layout_drops_what_sglang_builds_not(tmp_path: Path):
    plain, names = write_plain(tmp_path / "published", v41=True, layout=dsv41_fixture.PUBLISHED)
    sglang_lacks = in_sglang(SGLANG_VENV, "--unbuilt", str(plain), str(names))[0]
    rules = json.loads(SHIPPED.read_text())["rules"]["dropped_in_layers"][ARCH]
    config = json.loads((plain / "config.json").read_text())
    drops = tuple(d for module, rule in rules.items() for d in layer_drops(module, rule, "test"))
    ours = dropped_modules(drops, config)
    judged = [m for m in rules if m in sglang_lacks]
    assert {"layers.*.attn.compressor.wkv", "layers.*.attn.indexer.wk", "layers.*.attn.indexer.wq_b"} <= set(judged)
    for module in judged:
        doctor = sorted(i for i in range(config["num_hidden_layers"]) if module.replace("*", str(i)) in ours)
        assert doctor == sglang_lacks[module], module
