"""What a target runtime builds each layer as: BF16, or NVFP4 where it follows the checkpoint's own config."""

from __future__ import annotations

from repair.arch import Architecture, ModuleSpec
from repair.formats.base import Declaration
from repair.targets.profiles import Target


def runtime_precision(specs: dict[str, ModuleSpec], declaration: Declaration, target: Target, family: Architecture) -> dict[str, str]:
    """What the target builds each linear as: BF16, or NVFP4 where it follows the draft's own config
    (matched under the names the runtime gives the family's modules)."""
    out = {}
    for name, spec in specs.items():
        quantizable = spec.is_linear and spec.role not in ("embed",)
        follows = target.profile.follows_draft_config and declaration.quantized and quantizable
        out[name] = "nvfp4" if follows and not declaration.excludes(family.runtime_name(name)) else "bf16"
    return out
