"""Writing an output folder, for every command that writes one (`fix`, `fix --tp`, `unshard`):
the policy for OUT, build-then-publish, the small-JSON writer and the self-checks of what was written.

OUT is checked before anything is read, built in a temp folder beside it (repair.io.output.staged),
re-checked there, and published by one rename; the Hub publisher, which uploads file by file, uses
the same JSON writer and header check. Takes plain values only: io is the bottom layer.
"""

from __future__ import annotations

import errno
import json
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, TypeVar

from repair.errors import BadInput, InternalError, OutputError, RepairError
from repair.io.hashing import sha256_file
from repair.io.output import publish, staged
from repair.io.ownership import Proof, prove_ours
from repair.io.safetensors import read_header
from repair.io.staging import MARKER, InterruptGate, apply_modes, fsync_tree

T = TypeVar("T")
WRITTEN = "the check of the written output"  # what a failed self-check names, unless the command says otherwise
Expected = list[tuple[str, str, tuple[int, ...]]]  # a shard's tensors as (name, dtype, shape), in file order


def check_output(src: Path, out: Path, overwrite: bool, original: Path | None = None, *, prove: bool = False) -> Proof | None:
    """Refuse outputs that would touch an input (SRC or --original) or silently replace something.

    An existing OUT (with --overwrite) must be provably an earlier ckpt-repair output: its names are
    checked always, its bytes hashed only with `prove` (once per run, by build_atomically); returns
    that proof (None: OUT is absent, or only its names were checked)."""
    if out.name in ("", ".."):  # `.`, `..`, `/`: the temp folder and lock beside OUT would not be beside it
        raise OutputError(f"{out}: -o must name the folder to write (e.g. ../fixed), not '.', '..' or '/'")
    if out.is_symlink():
        raise OutputError(f"{out}: is a symlink; give the folder it points to, or remove the link, so nothing is written through it")
    for role, given in (("input", src), ("--original", original)):
        if given is None or not Path(given).exists():  # a Hub repo id names no local folder
            continue
        inp, out_r = Path(given).resolve(), out.resolve()
        if out_r == inp or out_r.is_relative_to(inp):
            raise OutputError(f"{out}: output is inside the {role} folder {given}; choose a folder outside it")
        if inp.is_relative_to(out_r):
            raise OutputError(f"{out}: output folder contains the {role} {given}; choose another folder")
    if not out.parent.is_dir():
        raise OutputError(f"{out.parent}: parent folder does not exist; create it first")
    if not out.exists():
        return None
    if not overwrite:
        raise OutputError(f"{out}: already exists; choose a new folder or pass --overwrite")
    if not out.is_dir():
        raise OutputError(f"{out}: exists and is not a folder; remove it or choose another name")
    try:
        proof = prove_ours(out, hash_files=prove)
    except OSError as exc:
        raise OutputError(f"{out}: cannot be read to prove it is an earlier ckpt-repair output ({exc.strerror or exc}); "
                          "it was left alone, choose another folder") from None
    return proof if prove else None


def build_atomically(src: Path, out: Path, overwrite: bool, build: Callable[[Path, InterruptGate], T], *, original: Path | None = None,
                     needed_bytes: Callable[[], int] | None = None) -> T:
    """Check OUT, run `build(tmp, gate)` in a temp folder beside it, then give the files SRC's modes, flush
    them and publish the folder by one rename; returns what `build` returned.

    `build` writes and checks every file; `gate.held()` makes a signal wait out a step that must not be cut in two
    (a file opened and not yet owned by a cleanup); `needed_bytes` sizes the output for a disk-full message.
    """
    proof = check_output(src, out, overwrite, original, prove=True)
    inputs = tuple(Path(p) for p in (src, original) if p is not None)
    try:
        with staged(out, inputs) as (tmp, state):
            value = build(tmp, state)
            apply_modes(tmp, src)
            fsync_tree(tmp)
            publish(tmp, out, state, overwrite, proof)
    except OSError as exc:
        raise _os_error(exc, out, needed_bytes) from None
    except EOFError:
        raise BadInput(f"{src}: a file got shorter while it was read; make sure nothing writes to the input, then re-run") from None
    return value


def _os_error(exc: OSError, out: Path, needed_bytes: Callable[[], int] | None) -> OutputError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        needs = f" (the output needs about {needed_bytes() / 1e6:,.1f} MB)" if needed_bytes else ""
        return OutputError(f"{out}: disk full while writing{needs}; nothing was written, "
                           f"free space on {out.parent} or choose an -o on another disk, then re-run")
    return OutputError(f"{exc.filename or out}: {exc.strerror or exc}; nothing was written, check the disk, folder and permissions, then re-run")


def json_text(content: dict) -> str:
    """A small JSON file's text as every output holds it: 2-space indent, key order kept, trailing newline.

    A lone surrogate (a file name that was not UTF-8, a hostile recipe name) has no UTF-8 form: such a file is
    written with JSON's `\\udcXX` escapes instead, which read back to the same string."""
    text = json.dumps(content, indent=2, ensure_ascii=False) + "\n"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(content, indent=2, ensure_ascii=True) + "\n"
    return text


def write_json(path: Path, content: dict) -> str:
    """Write a small JSON file (see json_text); return its sha256."""
    path.write_text(json_text(content), encoding="utf-8")
    return sha256_file(path)


def check_files(tmp: Path, out: Path, expected: set[str], check: str = WRITTEN, against: str = "the plan") -> None:
    """The temp folder holds exactly the expected files (its marker aside), before anything is published."""
    found = {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()} - {MARKER}
    if found != expected:
        raise InternalError(check, f"{out}: written files differ from {against} ({', '.join(sorted(found ^ expected))})")


def check_header(tmp: Path, out: Path, name: str, want: Expected, metadata: dict | None = None, *, check: str = WRITTEN,
                 against: str = "the plan") -> None:
    """Re-open the written shard tmp/name and compare its tensors (and metadata, when given) with what
    was meant to be written; a difference is our bug (InternalError, exit 3), named as out/name."""
    try:
        header = read_header(tmp / name)
    except RepairError as err:
        raise InternalError(check, f"{out / name}: does not re-open ({defect(err, tmp, out)})") from None
    got = [(t.name, t.dtype, tuple(t.shape)) for t in header.tensors]
    if got != [(n, d, tuple(s)) for n, d, s in want] or (metadata is not None and header.metadata != metadata):
        raise InternalError(check, f"{out / name}: written header does not match {against}")


@contextmanager
def own_output(folder: Path, shown_as: Path | str) -> Iterator[None]:
    """Around code that re-opens our own output (doctor after): a defect an input check finds there is
    ours, so its advice to the user ("remove the stale shard") and the temp folder's name must not show."""
    try:
        yield
    except BadInput as err:
        raise InternalError("re-opening the written output", defect(err, folder, shown_as)) from None


def defect(err: RepairError, folder: Path, shown_as: Path | str) -> str:
    """What an input check found in our own output, without its advice to the user (the part after "; ")."""
    return str(err).replace(str(folder), str(shown_as)).split("; ")[0]
