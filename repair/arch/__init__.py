"""Architecture knowledge: what each model family defines, looked up from config.json."""

from __future__ import annotations

from repair.arch import gemma4_assistant
from repair.arch.gemma4_assistant import ModuleSpec


def expected_modules(config: dict | None, where: str = "config.json") -> dict[str, ModuleSpec] | None:
    """Module specs for a known architecture, or None when the family is not known to us."""
    if gemma4_assistant.matches(config):
        return gemma4_assistant.expected_modules(config, where)
    return None


__all__ = ["ModuleSpec", "expected_modules"]
