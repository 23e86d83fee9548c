"""Which layers vLLM builds unquantized under its ModelOpt NVFP4 config only (run in .venv-vllm, by vllm_profile.py).

The profile builds every architecture under a quantize-everything ModelOpt NVFP4 config, and a layer built
"unquantized" there becomes a role for every format. Some model code declines one quantization method only:
vLLM 0.32's Qwen4Exp builds its QSA q/k/v/indexer linear with `without_modelopt_fp4(quant_config)`
(models/qwen4_exp/nvidia/model.py:104, qsa.py:416 and :505), which drops `modelopt_fp4` and hands every other
config through, so an llm-compressor (compressed-tensors) NVFP4 export of it loads with those layers quantized.
Here the model is built once more on the meta device under compressed-tensors' own NVFP4 config (targets
`Linear`, nothing ignored but the layers vLLM's NVFP4 refuses by shape), and every pattern built "unquantized"
under ModelOpt and "quantized" under compressed-tensors is returned: the profile's `modelopt_fp4_only`.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile

from vllm_load_facts import log, pattern
from raised_by import reraise_ours

# compressed-tensors' NVFP4 preset (llm-compressor's "NVFP4" scheme, as its exports write it: tests/data's ct configs)
_FP4 = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True, "dynamic": False,
        "scale_dtype": "torch.float8_e4m3fn"}
CT_NVFP4 = {"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "format": "nvfp4-pack-quantized", "weights": _FP4,
                                          "input_activations": dict(_FP4, dynamic="local")}}}


def ignored(patterns: list[str]) -> list[str]:
    """compressed-tensors `ignore` entries (regexes) for name patterns with `*` as layer numbers."""
    return ["re:^" + re.escape(p).replace(re.escape("*"), r"\d+") + "$" for p in patterns]


def modelopt_fp4_only(arch: str, config: dict, refused: list[str], modules: dict, build, state_of,
                      drafter: bool = False) -> list[str]:
    """The patterns of `modules` (the ModelOpt build's) built unquantized there and quantized under compressed-tensors'
    NVFP4 config; [] when none is unquantized, or vLLM builds no compressed-tensors model of it here (logged).
    `drafter`: of the MTP drafter vLLM builds for the config (Qwen3.5's `fc`: qwen3_5_mtp.py:95 drops modelopt_fp4)."""
    from vllm.model_executor.model_loader.utils import initialize_model

    declined = [p for p, m in modules.items() if m["state"] == "unquantized"]
    if not declined:
        return []
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(dict(config, architectures=[arch], quantization_config=dict(CT_NVFP4, ignore=ignored(refused)),
                           torch_dtype="bfloat16"), f)
        try:
            model = build(folder, initialize_model, drafter=drafter)[0]
        except Exception as e:  # noqa: BLE001 - no compressed-tensors build: the rows stay format-blind, as before
            reraise_ours(e)
            log(f"{arch}: no compressed-tensors build ({type(e).__name__}: {str(e)[:120]})")
            return []
    # by module, not by `weight`: a compressed-tensors NVFP4 layer holds `weight_packed`
    built: dict[str, set[str]] = {}
    for name, module in model.named_modules():
        built.setdefault(pattern(name), set()).add(state_of(module))
    return sorted(p for p in declined if built.get(p) == {"quantized"})
