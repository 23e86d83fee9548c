"""Cases about the output side of `fix`: an OUT inside SRC, already there or without a parent, and the
already-repaired checkpoint that must be a no-op.
"""

from __future__ import annotations

from .edits import assistant
from .registry import Case, case


@case
def out_inside_src(work):
    src = assistant(work)
    return Case(src, "output is inside the input folder", out=src / "fixed")


@case
def out_exists(work):
    src = assistant(work)
    (work / "out").mkdir()
    (work / "out" / "notes.txt").write_text("mine")
    return Case(src, "out: already exists; choose a new folder or pass --overwrite")


@case
def out_parent_missing(work):
    src = assistant(work)
    return Case(src, "parent folder does not exist; create it first", out=work / "no" / "out")


@case
def already_repaired(work):  # the fixed (or correctly exported) checkpoint: a no-op that says so
    return Case(assistant(work, broken=False), "nothing to repair; it is already fixed. Nothing written.", exit_code=0)
