"""Checkpoint format plug-ins. `detect` picks the one a checkpoint is stored in.

Each format is a module implementing `base.Format`; the first in FORMATS that claims a
checkpoint handles it, and ModelOpt NVFP4 (which also covers plain BF16 checkpoints) is last.
"""

from __future__ import annotations

from repair.formats import compressed_tensors, modelopt_nvfp4
from repair.formats.base import Declaration, Format
from repair.io.checkpoint import Checkpoint

FORMATS: tuple[Format, ...] = (compressed_tensors, modelopt_nvfp4)  # type: ignore[assignment]

__all__ = ["Declaration", "FORMATS", "Format", "detect", "by_name"]


def detect(ckpt: Checkpoint) -> Format:
    """The format a checkpoint is stored in (from its config, else its tensor names)."""
    return next(f for f in FORMATS if f.claims(ckpt))


def by_name(name: str) -> Format:
    return next(f for f in FORMATS if f.NAME == name)
