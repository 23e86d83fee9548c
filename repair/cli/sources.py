"""SRC arguments as Checkpoints, importing the Hub code only for a Hub repo id.

A path that exists is a local folder (it always wins over a repo id of the same spelling) and is
opened directly; `repair.hub` (and huggingface_hub through it) is imported only when SRC may name
a Hub repo, so `inspect` and `doctor` of a local folder skip the ~16 ms its import costs.
"""

from __future__ import annotations

from pathlib import Path

from repair.io.checkpoint import Checkpoint, open_checkpoint


def open_source(src: str | Path, *, scales: bool = True) -> Checkpoint:
    """A local checkpoint folder, or a Hub repo id `owner/name[@rev]` (see repair.hub.source.open_source)."""
    if Path(src).expanduser().exists():
        return open_checkpoint(Path(src))
    from repair.hub.spec import hub_spec

    if hub_spec(src) is None:  # not a repo id either: open_checkpoint says what is wrong with the path
        return open_checkpoint(Path(src))
    from repair.hub.source import open_source as open_hub_source

    return open_hub_source(src, scales=scales)
