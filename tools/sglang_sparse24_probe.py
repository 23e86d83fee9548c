"""Run SGLang's own compressed-tensors `get_linear_scheme` (CPU) on configs with a 2:4 sparsity config and print, as one
JSON line, what tools/sglang_sparse24.py needs judged: per scheme (`BF16`: a layer the quantization config ignores; the
group schemes as compressed-tensors' presets write them) and sparsity format, whether the release's own
`supports_cutlass_24` holds, what `get_linear_scheme` does for that layer (the scheme, or its error), and the tool's
reading of the installed source. Runs in SGLang's venv; imports nothing from the repo's `repair`.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_stubs  # noqa: E402

sglang_stubs.install()

from tools.sglang_linear_schemes import GROUPS, NVFP4_FORMAT  # noqa: E402
from tools.sglang_moe_schemes import preset_args  # noqa: E402
from tools.raised_by import reraise_ours  # noqa: E402
from tools.sglang_sparse24 import FORMATS, SCHEMES, read_tree  # noqa: E402

LAYER = "model.layers.0.mlp.down_proj"


def main() -> dict:
    from sglang.srt.layers import linear
    from sglang.srt.layers.quantization.compressed_tensors import compressed_tensors as module

    out = {"read": read_tree(ast.parse(Path(module.__file__).read_text(encoding="utf-8")))}
    for scheme, preset in SCHEMES.items():
        weights, inputs = preset_args(preset or "NVFP4")
        own = GROUPS[scheme][1] if preset else NVFP4_FORMAT  # the group's format, the config's too (one group)
        group = {"targets": ["Linear"], "weights": weights.model_dump(mode="json"), "format": own,
                 "input_activations": inputs.model_dump(mode="json") if inputs is not None else None}
        for fmt in FORMATS:
            config = module.CompressedTensorsConfig.from_config({
                "quant_method": "compressed-tensors", "format": own, "config_groups": {"group_0": group},
                "ignore": [LAYER] if preset is None else [],
                "sparsity_config": {"format": fmt, "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": ["lm_head"]}})
            layer = linear.RowParallelLinear.__new__(linear.RowParallelLinear)
            try:
                said = type(config.get_linear_scheme(layer=layer, layer_name=LAYER)).__name__
            except Exception as exc:  # noqa: BLE001 - the release's own refusal (or this host's CUDA query) is the answer
                reraise_ours(exc)
                said = f"raises {type(exc).__name__}: {exc}"
            out[f"{scheme} {fmt}"] = said
    out["stubs_called"] = list(sglang_stubs.CALLED)
    return out


if __name__ == "__main__":
    print(json.dumps(main()))
