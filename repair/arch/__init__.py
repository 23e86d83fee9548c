"""Architecture knowledge: what each model family defines, looked up from config.json.

Rows come from two places. Generated rows (`arch/profiled.py`) are read from the newest shipped runtime profile
(repair/targets/data/): every architecture the runtime's own model code could be built for, with the layers it
never quantizes and the layers it fuses. Hand rows (ARCHITECTURES) cover what no profile records: the Gemma 4
assistant's loader profile and the multimodal Qwen3.5/3.6 classes (MTP drafters' layers are in the profiles). A config no row matches gets `GENERIC`.
"""

from __future__ import annotations

from repair.arch.base import GENERIC, Architecture, LayerKind, ModuleSpec
from repair.arch.gemma4_assistant import GEMMA4_ASSISTANT
from repair.arch.moe_routers import QWEN3_5
from repair.arch.profiled import ReleaseProfile, read_profiles
from repair.arch.registry import Registry, resolve

ARCHITECTURES: tuple[Architecture, ...] = (GEMMA4_ASSISTANT, QWEN3_5)  # whole rows no profile replaces
PROFILES: tuple[ReleaseProfile, ...] = read_profiles()


def newest(runtime: str = "vllm") -> ReleaseProfile | None:
    """The newest shipped profile of a runtime (None when none ships)."""
    found = [p for p in PROFILES if p.runtime == runtime]
    return found[-1] if found else None


def architecture(config: dict | None, profile: ReleaseProfile | None = None, borrowed: bool = False,
                 registry: Registry | None = None) -> Architecture:
    """The row covering this config.json: a hand row, else the profile's generated row (default: the newest vLLM
    release's) for the listed name that release builds (arch/registry.py), else GENERIC; `borrowed`: as another
    runtime takes either, without vLLM's own name facts, for the listed name that runtime's `registry` builds
    (None: the first listed name)."""
    hand = next((a for a in ARCHITECTURES if a.matches(config)), None)
    if hand is not None:
        return hand.borrowed() if borrowed else hand
    profile = profile or newest()
    name = resolve(config, registry if borrowed else profile.registry if profile is not None else None).name
    row = profile.row(name, borrowed, config) if profile is not None and name is not None else None
    return GENERIC if row is None else row


def expected_modules(config: dict | None, where: str = "config.json") -> dict[str, ModuleSpec] | None:
    """Module specs for a known architecture, or None when the family is not known to us."""
    found = architecture(config).expected_modules
    return found(config, where) if found is not None and config else None


__all__ = ["ARCHITECTURES", "Architecture", "GENERIC", "LayerKind", "ModuleSpec", "PROFILES", "architecture",
           "expected_modules", "newest"]
