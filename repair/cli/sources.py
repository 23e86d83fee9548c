"""SRC arguments as Checkpoints, importing the Hub code only for a Hub repo id.

A path that exists is a local folder (it always wins over a repo id of the same spelling) and is
opened directly; so is a spelling whose parent folder exists locally (`work/fixd` is a typo of a
local path, not a Hub repo). `repair.hub` (and huggingface_hub through it) is imported only when
SRC may name a Hub repo, so `inspect` and `doctor` of a local folder skip the ~16 ms its import
costs. When the Hub cannot be reached, the line also says there is no such local folder: the
user may have mistyped a path, and a network error alone would not tell them.
"""

from __future__ import annotations

import os
from pathlib import Path

from repair.errors import RepairError
from repair.io.checkpoint import Checkpoint, open_checkpoint

_NETWORK = ("cannot reach", "the connection to")  # the Hub was never asked: the user may have meant a local path


def open_source(src: str | Path, *, scales: bool = True, inputs: tuple[Path, ...] = ()) -> Checkpoint:
    """A local checkpoint folder, or a Hub repo id `owner/name[@rev]` (see repair.hub.source.open_source);
    `inputs`: the run's local inputs, which a Hub work folder's cleanup must never remove."""
    path = Path(os.path.expanduser(src))  # unlike Path.expanduser, leaves `~unknown-user/x` as it is
    if path.exists() or (path.parent != Path(".") and path.parent.is_dir()):
        return open_checkpoint(Path(src))
    from repair.hub.spec import hub_spec

    if hub_spec(src) is None:  # not a repo id either: open_checkpoint says what is wrong with the path
        return open_checkpoint(Path(src))
    from repair.hub.source import open_source as open_hub_source

    try:
        return open_hub_source(src, scales=scales, inputs=inputs)
    except RepairError as err:
        if not any(words in str(err) for words in _NETWORK):
            raise
        said = str(err).removeprefix(f"{src}: ")
        raise type(err)(f"{src}: no such local folder, and as a Hub repo id: {said}") from None
