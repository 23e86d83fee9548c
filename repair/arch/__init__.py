"""Architecture knowledge: what each model family defines, looked up from config.json.

Rows come from two places. Generated rows (`arch/profiled.py`) are read from the newest shipped runtime profile
(repair/targets/data/): every architecture the runtime's own model code could be built for, with the layers it
never quantizes and the layers it fuses. Hand rows (ARCHITECTURES) cover what no profile records: the Gemma 4
assistant's loader profile and the multimodal Qwen3.5/3.6 classes (MTP drafters' layers are in the profiles). A config no row matches gets `GENERIC`.
"""

from __future__ import annotations

from dataclasses import replace

from repair.arch.base import GENERIC, Architecture, LayerKind, ModuleSpec
from repair.arch.configured import disagreement
from repair.arch.gemma4_assistant import GEMMA4_ASSISTANT
from repair.arch.moe_routers import QWEN3_5
from repair.arch.profiled import ReleaseProfile, read_profiles
from repair.arch.registry import Resolved, resolve

ARCHITECTURES: tuple[Architecture, ...] = (GEMMA4_ASSISTANT, QWEN3_5)  # whole rows no profile replaces
PROFILES: tuple[ReleaseProfile, ...] = read_profiles()


def newest(runtime: str = "vllm") -> ReleaseProfile | None:
    """The newest shipped profile of a runtime (None when none ships)."""
    found = [p for p in PROFILES if p.runtime == runtime]
    return found[-1] if found else None


def architecture(config: dict | None, profile: ReleaseProfile | None = None, borrowed: bool = False,
                 built: Resolved | None = None) -> Architecture:
    """The row of the listed class a release builds for this config.json: `built` (the target's decision,
    Target.built), else the one the profile's release builds (default: the newest vLLM release's; arch/registry.py).
    A hand row for that class (or claiming the config's model_type), else the profile's generated row, else GENERIC;
    `borrowed`: as another runtime takes either, without vLLM's own name facts."""
    profile = profile or newest()
    built = built or resolve(config, profile.registry if profile is not None else None)
    hand = next((a for a in ARCHITECTURES if a.matches(built.name, config)), None)
    if hand is not None:
        return hand.borrowed() if borrowed else hand
    row = profile.row(built.name, borrowed, config) if profile is not None and built.name is not None else None
    why = disagreement(profile.entries.get(built.name or ""), config) if row is None and profile is not None else None
    return (replace(GENERIC, not_covered=why) if why else GENERIC) if row is None else row


def expected_modules(config: dict | None, where: str = "config.json", row: Architecture | None = None) -> dict[str, ModuleSpec] | None:
    """Module specs for a known architecture (`row`, the target's; default: the newest vLLM release's), or None when
    the family is not known to us."""
    found = (row or architecture(config)).expected_modules
    return found(config, where) if found is not None and config else None


__all__ = ["ARCHITECTURES", "Architecture", "GENERIC", "LayerKind", "ModuleSpec", "PROFILES", "architecture",
           "expected_modules", "newest"]
