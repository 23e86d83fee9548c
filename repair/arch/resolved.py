"""What a runtime release builds for one config.json's `architectures` (arch/registry.py decides it), and how a
hostile listed name is shown in a message."""

from __future__ import annotations

from dataclasses import dataclass

from repair.errors import one_line

MAX_SHOWN = 120  # characters of a hostile name a message repeats


def shown(name: str) -> str:
    """A listed name as a message repeats it: cut, and escaped so that it cannot forge another output line."""
    return one_line(name[:MAX_SHOWN] + ("..." if len(name) > MAX_SHOWN else ""))


@dataclass(frozen=True)
class Resolved:
    """What the release builds for a config: `name`, the listed name whose class it builds (None: no listed name);
    `backend`: "transformers" when that class is the Transformers backend's (the profile's rows do not describe it),
    "remote code" when it is so only under --trust-remote-code (config.json's auto_map), `error` then saying what it
    does without; "auto_map" when the class auto_map's code defines decides, `error` then saying what it does when
    that code does not load; `error`: the release's refusal when it builds nothing."""

    name: str | None
    backend: str = ""
    error: str | None = None
    malformed: bool = False  # refused as no list of names at all (its config validation), not for the names
    derived: str | None = None  # none listed: the class the release named from model_type (then resolved as listed)
    runner: str | None = None  # and the runner it is built for ("pooling": an embedding or classifier model, no text)
