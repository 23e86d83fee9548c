"""Helpers for the TensorRT-LLM tests on the real-config fixtures (tools/real_fixture.py, tools/layout_fixture.py: their
fused siblings share one input_scale as ModelOpt's export does, which TensorRT-LLM asserts, tests/data/trtllm/
PROVENANCE.md, NVFP4LinearMethod.load_weight_scales)."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from tests.conftest import run_captured


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=4))


def doctor_json(capsys, src: Path, target: str, *flags: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", src, "--target", target, "--json", *flags)
    assert code in (0, 1), err
    return code, json.loads(out)


def findings(report: dict, code: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if code is None or f["code"] == code]


def write_deepseek_v4(folder: Path) -> Path:
    """nvidia/DeepSeek-V4-Flash-NVFP4's layout, tiny (TensorRT-LLM#16196's checkpoint family): its real
    hf_quant_config.json (MIXED_PRECISION: routed experts NVFP4 by `quantized_layers`, attention, shared experts, head
    and the MTP block excluded), the model's config.json without a quantization_config (as published; RedHat's copy
    of the same model's config, its compressed-tensors block taken out), DeepSeek-V4's native names. The attention
    projections are stored FP8 although excluded, as the report found (FP8 weight with a per-tensor weight_scale here,
    which the project reads; the published block scales make no difference to the loader behaviour tested)."""
    import shutil

    import torch

    from repair.codec import nvfp4

    folder = Path(folder)
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    gen = torch.Generator().manual_seed(0)
    hidden, inter, vocab = 64, 32, 128

    def bf16(*shape):
        return (torch.randn(shape, generator=gen) * 0.05).to(torch.bfloat16)

    tensors = {"embed.weight": bf16(vocab, hidden), "head.weight": bf16(vocab, hidden),
               "norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}
    for prefix in ("layers.0", "layers.1", "mtp.0"):
        for name, shape in (("wq_a", (32, hidden)), ("wkv", (32, hidden)), ("wq_b", (hidden, 32)), ("wo_a", (32, hidden)),
                            ("wo_b", (hidden, 32))):
            weight = torch.randn(shape, generator=gen) * 0.05
            if prefix.startswith("mtp"):
                tensors[f"{prefix}.attn.{name}.weight"] = weight.to(torch.bfloat16)
                continue
            scale = weight.abs().max() / 448
            tensors[f"{prefix}.attn.{name}.weight"] = (weight / scale).to(torch.float8_e4m3fn)
            tensors[f"{prefix}.attn.{name}.weight_scale"] = scale.float()
        for expert in (0, 1):
            weights = {name: bf16(*shape) for name, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter)))}
            shared = nvfp4.global_scale(torch.cat([weights["w1"], weights["w3"]]))  # ModelOpt: one scale per expert's w1/w3
            for name, weight in weights.items():
                module = f"{prefix}.ffn.experts.{expert}.{name}"
                if prefix.startswith("mtp"):
                    tensors[f"{module}.weight"] = weight
                    continue
                packed, scale, scale_2 = nvfp4.quantize(weight, shared.clone() if name != "w2" else None)
                tensors.update({f"{module}.weight": packed, f"{module}.weight_scale": scale,
                                f"{module}.weight_scale_2": scale_2, f"{module}.input_scale": torch.tensor(0.02)})
        for name, shape in (("w1", (inter, hidden)), ("w3", (inter, hidden)), ("w2", (hidden, inter))):
            tensors[f"{prefix}.ffn.shared_experts.{name}.weight"] = bf16(*shape)
        tensors[f"{prefix}.attn_norm.weight"] = torch.ones(hidden, dtype=torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    real = Path(__file__).parent / "data" / "real"
    config = json.loads((real / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json").read_text())
    config.pop("quantization_config")
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shutil.copy(real / "deepseek-v4-flash-nvfp4" / "hf_quant_config.json", folder)
    return folder
