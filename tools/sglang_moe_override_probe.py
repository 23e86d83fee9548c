"""Run SGLang's own model-specific server-arg override providers (srt/arg_groups/model_overrides/, as registered by
importing that package) for the architectures given, on stand-in server args (`--moe-runner-backend auto`, no MoE
all-to-all backend) and an hf_config carrying a ModelOpt quantization config, under SGLang's own `override_platform`
for each GPU in GPUS, and print as one JSON line the MoE runner backend each sets (None where none), per
architecture, GPU and config. Runs in SGLang's venv; imports nothing from the repo's `repair`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_stubs  # noqa: E402

sglang_stubs.install()

GPUS = {"sm90": {"is_sm90": True, "is_sm100": False}, "sm100": {"is_sm90": False, "is_sm100": True}}
CONFIGS = {  # quantization (the server args') -> hf_config's quantization_config
    "modelopt_fp4": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    "modelopt_mixed": {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                       "quantized_layers": {"model.layers.0.mlp.experts": {"quant_algo": "W4A16_NVFP4"}}},
}


def main(architectures: list[str]) -> dict:
    from sglang.srt.arg_groups import model_overrides  # noqa: F401 - importing it registers the providers
    from sglang.srt.arg_groups.model_override_base import _MODEL_OVERRIDE_FNS
    from sglang.srt.runtime_context import override_platform

    out: dict = {}
    for arch in architectures:
        for gpu, facts in GPUS.items():
            for quantization, config in CONFIGS.items():
                args = SimpleNamespace(moe_runner_backend="auto", moe_a2a_backend="none", quantization=quantization,
                                       _quantization_explicitly_unset=False, _resolved_overrides=None, device="cuda")
                hf_config = SimpleNamespace(quantization_config=config, architectures=[arch])
                picked = None
                with override_platform(**facts):
                    for fn in _MODEL_OVERRIDE_FNS.get(arch, ()):
                        picked = fn(args, hf_config).get("moe_runner_backend", picked)
                out.setdefault(arch, {}).setdefault(gpu, {})[quantization] = picked
    return {"picked": out, "stubs_called": list(sglang_stubs.CALLED)}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:])))
