"""`fix --target T` keeps its promise (issue 25.6): its output passes `doctor OUT --target T --strict`, or the run
refuses with exit 2 and writes nothing, on every fixture and real-config checkpoint, as exported and with every
stored-algorithm contradiction injected.

Checkpoints: the published configs and names (tools/real_fixture.py, tests/data/real), real ModelOpt exports (a tiny
Llama, ModelOpt's own MIXED_PRECISION export), the Qwen3.6 layout, the Gemma 4 assistant exports and the demo
assistant, and compressed-tensors' own conversion (tests/conftest.py session fixtures). Injections rewrite one
quantized layer's stored tensors so that they show another algorithm than the config declares for it: an NVFP4 layer
losing its input_scale (W4A16_NVFP4) or gaining a pre_quant_scale (NVFP4_AWQ), stored FP8 instead, an FP8 layer
stored NVFP4, a weight-only layer gaining an AWQ scale or an activation scale, an AWQ layer losing its scale.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from repair import formats
from repair.codec import fp8, nvfp4
from repair.io.checkpoint import open_checkpoint
from tests.conftest import LLAMA_31, run_captured
from tools.real_fixture import REAL_MODELS

SESSION = ("mixed_export", "qwen36_export", "broken_export", "correct_export", "ct_export", "broken")
CHECKPOINTS = (*REAL_MODELS, LLAMA_31, "modelopt-llama", *SESSION)
# injection -> (stored algorithms it applies to, declared algorithm it must contradict)
INJECTIONS = ("none", "no-input-scale", "pre-quant-scale", "as-fp8", "as-nvfp4", "no-pre-quant-scale", "input-scale-on-weight-only")
APPLIES = {"no-input-scale": ("NVFP4",), "pre-quant-scale": ("NVFP4", "W4A16_NVFP4"), "as-fp8": ("NVFP4", "W4A16_NVFP4"),
           "as-nvfp4": ("FP8",), "no-pre-quant-scale": ("NVFP4_AWQ",), "input-scale-on-weight-only": ("W4A16_NVFP4",)}


@pytest.fixture(scope="module")
def built(real_models, llama31, modelopt_llama) -> dict[str, Path]:
    """The real-config checkpoints and ModelOpt's tiny Llama by key (conftest's session fixtures, shared with other modules)."""
    return {**real_models, LLAMA_31: llama31, "modelopt-llama": modelopt_llama}


def source(request, built: dict[str, Path], key: str) -> Path:
    return request.getfixturevalue(key) if key in SESSION else built[key]


def victim(folder: Path, injection: str):
    """(format, the first quantized layer stored in an algorithm the injection applies to), or None."""
    ckpt = open_checkpoint(folder)
    fmt = formats.detect(ckpt)
    modules = sorted((m for m in fmt.group_modules(ckpt.infos()) if m.algorithm in APPLIES[injection]), key=lambda m: m.name)
    if injection == "pre-quant-scale" and "pre_quant_scale" not in fmt.LEAVES:
        return None  # compressed-tensors has no name for an AWQ scale: it would be an unknown tensor, not a contradiction
    return (fmt, modules[0]) if modules else None


def inject(src: Path, dst: Path, injection: str) -> bool:
    """Copy `src` to `dst` with one layer's stored tensors contradicting its declared algorithm; False if none applies."""
    found = victim(src, injection)
    if found is None:
        return False
    fmt, m = found
    shutil.copytree(src, dst)
    weight_name = m.tensor("weight")
    shard = next(p for p in sorted(dst.glob("*.safetensors")) if weight_name in safe_open(p, "pt").keys())
    with safe_open(shard, "pt") as fh:
        tensors, metadata = {k: fh.get_tensor(k) for k in fh.keys()}, fh.metadata()
    leaf = {role: f"{m.name}.{fmt.LEAVES.get(role, role)}" for role in ("input_scale", "pre_quant_scale")}
    columns = m.logical_shape[1]
    if injection == "no-input-scale":
        tensors.pop(m.tensor("input_scale"), None)
    elif injection == "pre-quant-scale":
        tensors[leaf["pre_quant_scale"]] = torch.linspace(0.5, 2.0, columns).to(torch.bfloat16)
    elif injection == "input-scale-on-weight-only":
        tensors[leaf["input_scale"]] = torch.tensor(0.01)
    elif injection == "no-pre-quant-scale":
        tensors.pop(m.tensor("pre_quant_scale"))
    else:
        weight = torch.randn(m.logical_shape, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16) * 0.05
        for name in m.tensors:
            if not name.endswith(("input_scale", "k_scale", "v_scale")):
                tensors.pop(name, None)
        if injection == "as-fp8":
            w, s = fp8.quantize(weight)
            tensors.update({weight_name: w, f"{m.name}.weight_scale": s})
        else:
            packed, block, scale_2 = nvfp4.quantize(weight)
            tensors.update({weight_name: packed, f"{m.name}.weight_scale": block, f"{m.name}.weight_scale_2": scale_2.reshape(())})
    save_file({k: v.contiguous() for k, v in tensors.items()}, shard, metadata=metadata)
    _reindex(dst, shard.name, tensors)
    return True


def _reindex(folder: Path, shard: str, tensors: dict) -> None:
    """Keep an index's weight map true to the rewritten shard."""
    import json

    index = folder / "model.safetensors.index.json"
    if not index.exists():
        return
    data = json.loads(index.read_text())
    data["weight_map"] = {k: v for k, v in data["weight_map"].items() if v != shard} | {k: shard for k in tensors}
    index.write_text(json.dumps(data))


@pytest.mark.parametrize("target", ["vllm==0.32.0", "vllm==0.25.0", "bf16"])
@pytest.mark.parametrize("injection", INJECTIONS)
@pytest.mark.parametrize("key", CHECKPOINTS)
def test_target_output_passes_strict_doctor_or_the_fix_refuses(request, built, capsys, tmp_path, key, injection, target):
    src = source(request, built, key)
    if injection != "none":
        if target == "vllm==0.25.0" and key not in ("broken_export", "correct_export", "broken"):
            pytest.skip("vLLM 0.25 differs from 0.32 only for a drafter with a loader profile")
        if target == "bf16" and key in REAL_MODELS and key not in ("llama-3.3-70b", "ct-llama-dense"):
            pytest.skip("bf16 dequantizes every layer by what it stores: two real layouts show it (run time)")
        if not inject(src, tmp_path / "src", injection):
            pytest.skip(f"{key} stores no layer {injection} applies to")
        src = tmp_path / "src"
    out = tmp_path / "out"
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", target, "--quiet")
    if code == 2:  # refused: one line, and nothing written
        assert err.count("\n") == 1 and "Traceback" not in err, err
        assert not out.exists() and not list(tmp_path.glob(".out.partial*")), err
        return
    assert code == 0, (code, text, err)
    if not out.exists():  # "nothing to fix": the input itself is what the promise is about
        assert "nothing to fix" in text, text
        out = src
    code, text, _ = run_captured(capsys, "doctor", out, "--target", target, "--strict")
    assert code == 0, text
