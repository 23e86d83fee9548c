"""The Gemma 4 assistant (the MTP drafter of issue #1) fixed for SGLang, alone and beside vLLM and TensorRT-LLM 1.2,
loads in SGLang 0.5.23's own Gemma4AssistantForCausalLM (sglang/srt/models/gemma4_mtp.py) with its handshake layers
built BF16 and no weight skipped: the borrowed rows give SGLang the checkpoint's names (`pre_projection`), not vLLM's
`draft_model.` ones. The input, ModelOpt's export and compressed-tensors' conversion of it, is built NVFP4 there.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_cli

from .probe import TARGET, load_in_sglang, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
HANDSHAKE = ("pre_projection", "post_projection")
TARGETS = (TARGET, "vllm==0.32.0," + TARGET + ",trtllm==1.2.0")


@pytest.fixture(scope="module")
def loaded(broken_export, ct_export, tmp_path_factory):
    root = tmp_path_factory.mktemp("gemma4_assistant_sglang")
    inputs = {"modelopt": broken_export, "compressed-tensors": ct_export}
    outputs = {}
    for name, src in inputs.items():
        for i, targets in enumerate(TARGETS):
            out = outputs[name, targets] = root / f"{name}-{i}"
            assert run_cli("fix", src, "-o", out, "--target", targets, "--quiet") == 0, (name, targets)
    lines = load_in_sglang([*inputs.values(), *outputs.values()])
    return {name: lines[src] for name, src in inputs.items()}, {key: lines[out] for key, out in outputs.items()}


def test_the_inputs_handshake_layers_are_built_nvfp4(loaded):
    for name, line in loaded[0].items():
        assert [line["layers"][m]["scheme"] for m in HANDSHAKE] == ["nvfp4", "nvfp4"], (name, line["layers"])


@pytest.mark.parametrize("targets", TARGETS)
@pytest.mark.parametrize("name", ["modelopt", "compressed-tensors"])
def test_the_fixed_assistant_loads_in_sglang_with_bf16_handshake_layers(loaded, name, targets):
    line = loaded[1][name, targets]
    assert line["ok"], line
    assert [t for t in line.get("skipped", []) if t.endswith((".weight", ".weight_packed"))] == [], line["skipped"]
    assert [line["layers"][m]["scheme"] for m in HANDSHAKE] == ["bf16", "bf16"], line["layers"]
    assert {f"{m}.weight" for m in HANDSHAKE} <= set(line["owners"])
