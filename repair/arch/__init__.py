"""Architecture knowledge: what each model family defines, looked up from config.json.

ARCHITECTURES is the registry: a new family is one `Architecture` row (its own module when it brings
expected shapes or name mappings). A config no row matches gets `GENERIC` (identity names, no profile).
"""

from __future__ import annotations

from repair.arch.base import GENERIC, Architecture, LayerKind, ModuleSpec
from repair.arch.gemma4_assistant import GEMMA4_ASSISTANT
from repair.arch.moe_routers import DEEPSEEK_V3, LAGUNA, QWEN3_5, QWEN3_NEXT

ARCHITECTURES: tuple[Architecture, ...] = (GEMMA4_ASSISTANT, DEEPSEEK_V3, LAGUNA, QWEN3_5, QWEN3_NEXT)


def architecture(config: dict | None) -> Architecture:
    """The row covering this config.json, else GENERIC."""
    return next((a for a in ARCHITECTURES if a.matches(config)), GENERIC)


def expected_modules(config: dict | None, where: str = "config.json") -> dict[str, ModuleSpec] | None:
    """Module specs for a known architecture, or None when the family is not known to us."""
    found = architecture(config).expected_modules
    return found(config, where) if found is not None and config else None


__all__ = ["ARCHITECTURES", "Architecture", "GENERIC", "LayerKind", "ModuleSpec", "architecture", "expected_modules"]
