"""Progress bars in bytes, on stderr, for commands that stream files (fix, fix --tp, doctor --deep).

A bar that is not shown (`--quiet`, stderr not a terminal) is a stand-in that counts nothing, and tqdm is never
imported: its import (~12 ms, most of it reading its own package metadata for a version string) is start-up time
every such run would pay for nothing.
"""

from __future__ import annotations


class NoBar:
    """The bar not shown: accepts what a tqdm bar is given and does nothing."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "NoBar":
        return self

    def __exit__(self, *exc) -> None:
        pass


def byte_bar(total: int, desc: str, show: bool, divisor: int = 1000):
    """A tqdm bar of `total` bytes labelled `desc` (units of `divisor`) when `show`, else a NoBar. Leaves no line behind."""
    if not show:
        return NoBar()
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=divisor, desc=desc, leave=False)
