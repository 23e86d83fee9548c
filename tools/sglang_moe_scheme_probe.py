"""Run SGLang's own compressed-tensors MoE scheme choice on a weight-only NVFP4 config (CPU) and print, as one JSON
line, what tools/sglang_moe_schemes.py needs judged: each predicate of get_moe_scheme's chain as the release's own
method answers it and as the tool's compiled copy of its source answers it, and the scheme (or error) get_moe_scheme
gives, as shipped and with its weight-only branch's predicate answering False (the chain a release without that
branch runs). Runs in SGLang's venv; imports nothing from the repo's `repair`.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_stubs  # noqa: E402

sglang_stubs.install()

import torch  # noqa: E402

from tools.sglang_moe_schemes import ALGORITHMS, ask, chain, method, outcomes, preset_args  # noqa: E402
from tools.raised_by import reraise_ours  # noqa: E402

WEIGHT_ONLY = "_is_fp4a16_nvfp4"  # the branch 0.5.23 has and 0.5.9-0.5.11 lack


def scheme(config) -> str:
    fused = type("FusedMoE", (torch.nn.Module,), {})()  # the class name compressed-tensors' targets match the layer by
    try:
        return type(config.get_moe_scheme(fused, "model.layers.0.mlp.experts")).__name__
    except Exception as exc:  # noqa: BLE001 - the release's own refusal is the answer
        reraise_ours(exc)
        return f"raises {type(exc).__name__}: {exc}"


def main() -> dict:
    from sglang.srt.layers.quantization.compressed_tensors import compressed_tensors as module

    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    out = {}
    for algo, preset in ALGORITHMS.items():
        weights, inputs = preset_args(preset)
        config = module.CompressedTensorsConfig.from_config({
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights.model_dump(mode="json"),
                                          "input_activations": inputs, "format": "nvfp4-pack-quantized"}}})
        names = [name for name, _, _ in chain(method(tree)[1]) if name is not None]
        real = {name: ask(config, name, weights, inputs) for name in names}
        shipped = scheme(config)
        setattr(config, WEIGHT_ONLY, lambda *args: False)  # this instance only: the chain without that branch
        out[algo] = {"real": real, "compiled": outcomes(tree, preset), "scheme": shipped, "without": scheme(config),
                     "stubs_called": list(sglang_stubs.CALLED)}
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
