"""What a malformed case is and the index of them all: each case module registers its builders here with
@case, in the order the package imports those modules, and `build` runs one by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


@dataclass(frozen=True)
class Case:
    src: Path
    expect: str  # substring of the one error line (or of stdout when exit_code is 0)
    out: Path | None = None  # None: <work>/out
    exit_code: int = 2
    args: tuple[str, ...] = ()  # more `fix` arguments (a recipe file, --requantize ...)


CASES: dict[str, Callable[[Path], Case]] = {}


def case(fn: Callable[[Path], Case]) -> Callable[[Path], Case]:
    CASES[fn.__name__] = fn
    return fn


def build(name: str, work: Path) -> Case:
    """Build case `name` inside the (empty or missing) folder `work`."""
    Path(work).mkdir(parents=True, exist_ok=True)
    return CASES[name](Path(work))
