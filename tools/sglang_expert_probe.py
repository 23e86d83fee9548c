"""Run SGLang 0.5.23's own NVFP4 MoE scale handling on CPU on one tiny layer whose experts' gate/up global scales
differ, and print what it kept (one JSON line). Runs in SGLang's venv; imports nothing from the repo's `repair`.

What runs is SGLang's: ModelOptNvFp4FusedMoEMethod.process_weights_after_loading on the marlin path up to the Marlin
repack, `_compute_gemm1_alphas` (every other backend's gate/up alphas), flashinfer_trtllm.py `_compute_g1_scale_c`
(the TRT-LLM kernel's up-half scale), CompressedTensorsW4A16Nvfp4MoE.process_weights_after_loading up to its
Marlin repack, compressed-tensors' get_moe_scheme on a weight-only NVFP4 config, and the MoE backend picked when none
is asked for (the server args' post-process, then create_moe_runner) by GPU. Stand-ins, each deciding no scale: the method objects are made without `__init__` (it asks a GPU for
its platform and backend; the backend is set as `create_moe_runner` sets it, `_moe_runner_backend`), and
`prepare_moe_nvfp4_layer_for_marlin` (the CUDA repack of the weights, called after the scale is chosen) is a
recorder that notes the scale it is handed. Which backend reads which alpha in `apply` is not run here (its kernels
need a GPU): tools/sglang_expert_scales.py reads it (ast).
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_stubs  # noqa: E402

sglang_stubs.install()

import torch  # noqa: E402

GATE, UP = 2.0, 3.0  # each expert's w1 and w3 global scale (column 0 and 1 of the [E, 2] parameter)


class Logged(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def layer(scale_name: str, experts: int = 2) -> torch.nn.Module:
    out = torch.nn.Module()
    out.register_parameter(scale_name, torch.nn.Parameter(torch.tensor([[GATE, UP]] * experts), requires_grad=False))
    out.moe_runner_config = SimpleNamespace(is_gated=True)
    return out


def main() -> dict:
    from sglang.srt.layers.moe.moe_runner import flashinfer_trtllm
    from sglang.srt.layers.moe.utils import MoeRunnerBackend
    from sglang.srt.layers.quantization import marlin_utils_fp4, modelopt_quant
    from sglang.srt.layers.quantization.compressed_tensors.schemes import compressed_tensors_w4a16_nvfp4_moe as ct

    handed: list[list[float]] = []
    recorder = lambda layer: handed.append(layer.w13_weight_scale_2.tolist())  # noqa: E731
    modelopt_quant.prepare_moe_nvfp4_layer_for_marlin = recorder
    marlin_utils_fp4.prepare_moe_nvfp4_layer_for_marlin = recorder
    logged = Logged()
    logging.getLogger("sglang").addHandler(logged)
    logging.getLogger(modelopt_quant.__name__).addHandler(logged)

    method = object.__new__(modelopt_quant.ModelOptNvFp4FusedMoEMethod)
    method._moe_runner_backend = MoeRunnerBackend.MARLIN
    moe = layer("w13_weight_scale_2")
    method.process_weights_after_loading(moe)
    marlin = {"handed": handed[-1] if handed else None, "logged": list(logged.lines)}

    ones = torch.ones(2)
    gate_alpha, up_alpha = modelopt_quant._compute_gemm1_alphas(layer("w13_weight_scale_2").w13_weight_scale_2, ones, True)
    scale_c = flashinfer_trtllm._compute_g1_scale_c(ones, gate_alpha, up_alpha, True, activation="silu")

    w4a16 = object.__new__(ct.CompressedTensorsW4A16Nvfp4MoE)
    w4a16.has_input_global_scale = False
    dense = layer("w13_weight_global_scale")
    for name in ("w13_weight_packed", "w2_weight_packed"):
        dense.register_parameter(name, torch.nn.Parameter(torch.zeros(2, 4, 4, dtype=torch.uint8), requires_grad=False))
    dense.register_parameter("w2_weight_global_scale", torch.nn.Parameter(torch.ones(2), requires_grad=False))
    try:
        w4a16.process_weights_after_loading(dense)
        refused = None
    except ValueError as exc:
        refused = str(exc)
    return {"marlin": marlin, "alphas": [gate_alpha.tolist(), up_alpha.tolist()], "trtllm_scale_c": scale_c.tolist(),
            "ct_w4a16_refused": refused, "ct_weight_only_scheme": weight_only_scheme(), "picked": picked(),
            "gate": GATE, "up": UP}


def picked() -> dict[str, str]:
    """The MoE runner backend SGLang picks for an NVFP4 MoE when none is asked for, by GPU and --quantization: its
    server args' post-process (arg_groups/overrides.py, under its own platform override) first, then the method's
    create_moe_runner (its `is_cuda`/`get_device_capability` answering for that GPU; it records the choice before it
    builds the runner, which needs a real MoE config: that error is expected and ignored)."""
    from sglang.srt.arg_groups import overrides
    from sglang.srt.layers.quantization import modelopt_quant
    from sglang.srt.runtime_context import override_platform

    out = {}
    for major in (8, 9, 10, 11, 12):
        for quantization in (None, "modelopt_fp4", "modelopt_mixed"):
            gpu = {f"is_sm{m}0": m == major for m in (10, 11, 12)}
            with override_platform(**gpu, is_hip=False, is_npu=False):
                view = SimpleNamespace(moe_runner_backend="auto", quantization=quantization, moe_a2a_backend="none")
                chosen = overrides._moe_runner_backend_quant_constraints(view).get("moe_runner_backend")
            if chosen is None:
                modelopt_quant.is_cuda, modelopt_quant.get_device_capability = (lambda: True), (lambda: (major, 0))
                method = object.__new__(modelopt_quant.ModelOptNvFp4FusedMoEMethod)
                try:
                    method.create_moe_runner(torch.nn.Module(), SimpleNamespace(is_gated=True))
                except AttributeError:
                    pass
                chosen = method._moe_runner_backend.name.lower()
            out[f"{major}.0 {quantization}"] = chosen
    return out


def weight_only_scheme() -> str:
    """The scheme SGLang's compressed-tensors config picks for a routed-experts layer of a weight-only NVFP4 config
    (`input_activations` null, as llm-compressor's NVFP4A16 writes it): get_moe_scheme asks no GPU for it."""
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    weights = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16, "symmetric": True,
               "dynamic": False}
    config = CompressedTensorsConfig.from_config({
        "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                      "format": "nvfp4-pack-quantized"}}})
    fused = type("FusedMoE", (torch.nn.Module,), {})()  # the class name compressed-tensors' targets match the layer by
    return type(config.get_moe_scheme(fused, "model.layers.0.mlp.experts")).__name__


if __name__ == "__main__":
    print(json.dumps(main()))
