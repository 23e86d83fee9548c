"""SGLang 0.5.23's own `get_linear_scheme` on CPU (tools/sglang_sparse24_probe.py) for a Linear a 2:4 sparsity config
targets, per scheme and sparsity format, against tools/sglang_sparse24.py's reading of the same source and the data:
the layers the data says it refuses raise its ImportError; every other one passes the sparsity check (and reaches the
scheme's CUDA capability query on this host, after the scheme is picked)."""

from __future__ import annotations

import pytest

from repair.targets.runtime_rules import shipped_rules
from .probe import requires_sglang, run_tool_probe

pytestmark = [pytest.mark.sglang, requires_sglang]


@pytest.fixture(scope="module")
def ran() -> dict:
    return run_tool_probe("sglang_sparse24_probe.py")


def test_the_release_refuses_exactly_the_layers_its_data_says(ran):
    fact = {r.label: r.sparse_24_refused for r in shipped_rules()}["sglang 0.5.23"]
    assert ran["read"] == fact and ran["stubs_called"] == [], ran
    refused = fact["compressed-tensors"]["refused"]
    for key, said in ((k, v) for k, v in ran.items() if k not in ("read", "stubs_called")):
        scheme, fmt = key.split(" ")
        expected = {"raises " + fact["compressed-tensors"]["error"]} if scheme in refused.get(fmt, ()) else {
            "raises AssertionError: Torch not compiled with CUDA enabled"}
        assert said in expected or (scheme not in refused.get(fmt, ()) and said.startswith("CompressedTensors")), (key, said)
