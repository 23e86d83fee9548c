"""Checkpoint formats, registered as objects. `detect` picks the one a checkpoint is stored in.

Each format is an instance of a `base.Format` subclass; the first in FORMATS that claims a
checkpoint handles it (DeepSeek-V4's `fp8` form and ModelOpt MIXED_PRECISION before plain ModelOpt), and ModelOpt NVFP4 (which also covers plain BF16 checkpoints) is last.
The plan and the declaration hold the Format object itself, so nothing re-resolves a format by name.
"""

from __future__ import annotations

from repair.errors import InternalError
from repair.formats.base import Declaration, Format
from repair.formats.compressed_tensors import COMPRESSED_TENSORS
from repair.formats.deepseek_v4_fp8 import DEEPSEEK_V4_FP8
from repair.formats.modelopt_mixed import MODELOPT_MIXED
from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
from repair.io.checkpoint import Checkpoint

FORMATS: tuple[Format, ...] = (COMPRESSED_TENSORS, DEEPSEEK_V4_FP8, MODELOPT_MIXED, MODELOPT_NVFP4)

__all__ = ["Declaration", "FORMATS", "Format", "detect", "by_name"]


def detect(ckpt: Checkpoint) -> Format:
    """The format a checkpoint is stored in (from its config, else its tensor names); ModelOpt claims any."""
    return next(f for f in FORMATS if f.claims(ckpt))


def by_name(name: str) -> Format:
    """The registered format called `name` (a name we wrote ourselves, so an unknown one is our bug)."""
    for fmt in FORMATS:
        if fmt.NAME == name:
            return fmt
    raise InternalError("format lookup", f"no registered format is called {name!r} (known: {', '.join(f.NAME for f in FORMATS)})")
