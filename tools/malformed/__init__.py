"""A corpus of malformed checkpoints: one small builder per defect, for the reliability tests.

Each builder gets an empty work folder, writes the tiny broken NVFP4 assistant there (the
project's own codec, no ModelOpt import) and breaks one thing the way real downloads and
exports break. It returns a Case: the folder to give `fix`, a substring the one-line error
must contain, and for the output-side cases the OUT to use. To look at every case by hand:

    python -m tools.malformed /tmp/corpus      # then: ckpt-repair fix /tmp/corpus/<case>/src -o ...

This package is the public face: `registry` (Case, CASES, case, build) and `edits` (the starting
assistant, file names, byte and JSON edits) hold the building blocks; one module per kind of defect
registers its cases, imported below in the order CASES lists them.
"""

from __future__ import annotations

from .edits import INDEX, ONE, SHARD_1, SHARD_2, SHARD_3, SHARDS, assistant, edit_tensors
from .registry import CASES, Case, build, case

# importing the case modules registers their cases; this order is CASES order (the tests', `python -m`'s)
from . import shard_file, folder, config, packed, parsing, output  # noqa: F401  # isort: skip

__all__ = ["CASES", "INDEX", "ONE", "SHARD_1", "SHARD_2", "SHARD_3", "SHARDS", "Case", "assistant", "build", "case",
           "edit_tensors"]
