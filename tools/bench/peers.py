"""The peers that decode and re-encode everything, run as scripts, and output comparison with ours.

- naive: safetensors `load_file` of every shard, dequantize with our codec, `save_file` everything.
- compressed-tensors `convert_checkpoint` (0.20): it has no ModelOpt-NVFP4 dequantizer, so the chain
  that applies is `ModelOptNvfp4Converter` (ModelOpt names -> compressed-tensors NVFP4: weight ->
  weight_packed, weight_scale_2 -> weight_global_scale = 1/x, input_scale -> 1/x) followed by
  `CompressedTensorsDequantizer`. Its validation refuses to convert only some modules, so it can
  only dequantize every packed module: the equivalent of our `fix --target bf16`.
"""

from __future__ import annotations

from pathlib import Path

NAIVE = r"""
import json, os, shutil, sys
from safetensors.torch import load_file, save_file
from repair.codec import nvfp4
src, dst, modules = sys.argv[1], sys.argv[2], sys.argv[3].split(",")
os.makedirs(dst)
for name in os.listdir(src):
    if not name.endswith(".safetensors"):
        shutil.copy(os.path.join(src, name), dst)
        continue
    state = load_file(os.path.join(src, name))
    for m in modules:
        if m + ".weight_scale" in state:
            state[m + ".weight"] = nvfp4.dequantize(state[m + ".weight"], state.pop(m + ".weight_scale"), state.pop(m + ".weight_scale_2"))
            state.pop(m + ".input_scale", None)
    save_file(state, os.path.join(dst, name), metadata={"format": "pt"})
"""

COMPRESSED_TENSORS = r"""
import sys, warnings
warnings.filterwarnings("ignore")
from loguru import logger
logger.remove()
from compressed_tensors.entrypoints.convert import convert_checkpoint
from compressed_tensors.entrypoints.convert.converters.modelopt_nvfp4 import ModelOptNvfp4Converter
from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer
src, dst = sys.argv[1], sys.argv[2]
convert_checkpoint(src, dst, [ModelOptNvfp4Converter(targets=["Linear"]), CompressedTensorsDequantizer(src)], device="cpu")
"""


def compare(ours: Path, theirs: Path) -> dict:
    """Tensor by tensor, bitwise: names, dtypes, and for differing tensors how many elements and by how much."""
    import torch
    from safetensors import safe_open

    def tensors(folder: Path) -> dict:
        out = {}
        for f in sorted(folder.glob("*.safetensors")):
            with safe_open(f, "pt") as fh:
                out.update({k: fh.get_tensor(k) for k in fh.keys()})
        return out

    a, b = tensors(ours), tensors(theirs)
    common = sorted(set(a) & set(b))
    differing, elements, worst = [], 0, 0.0
    total = 0
    for k in common:
        x, y = a[k], b[k]
        same = x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.reshape(-1).view(torch.uint8), y.reshape(-1).view(torch.uint8))
        if not same:
            differing.append(k)
            if x.shape == y.shape and x.is_floating_point() and y.is_floating_point():
                ne = x.float() != y.float()
                elements += int(ne.sum())
                total += x.numel()
                worst = max(worst, float(((x.float() - y.float()).abs() / x.float().abs().clamp_min(1e-30))[ne].max()) if ne.any() else 0.0)
    return {"only_ours": sorted(set(a) - set(b)), "only_theirs": sorted(set(b) - set(a)), "same": len(common) - len(differing),
            "differing": differing, "differing_elements": elements, "elements_in_differing": total, "max_rel_diff": worst,
            "files_theirs": sorted(p.name for p in theirs.iterdir())}
