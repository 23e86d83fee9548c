"""Plan -> files. Streams tensor bytes, builds the output in a temporary folder beside OUT and
renames it into place only when every file is written and checked. The input is only read.
"""

from __future__ import annotations

import errno
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

from tqdm import tqdm

from repair.planning import check as plan_check
from repair.errors import BadInput, InternalError, OutputError, RepairError
from repair.io.dtypes import nbytes
from repair.io.hashing import copy_file_hashed, sha256_file
from repair.io.safetensors import read_header
from repair.io.shard_writer import OutTensor, ShardWriter
from repair.io.output import is_earlier_output, publish, staged
from repair.io.staging import MARKER, PARTIAL_TAG, apply_modes, fsync_tree, remove_stale_partials
from repair.planning.build import Plan, ShardStep
from repair.execute.report import REPORT_NAME, build_report

__all__ = ["PARTIAL_TAG", "Result", "check_output", "execute", "remove_stale_partials"]


@dataclass(frozen=True)
class Result:
    """What a run produced: the output folder and the report written into it."""

    out: Path
    report: dict


def check_output(src: Path, out: Path, overwrite: bool, original: Path | None = None) -> None:
    """Refuse outputs that would touch an input (SRC or --original) or silently replace something."""
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
    if out.exists() and not overwrite:
        raise OutputError(f"{out}: already exists; choose a new folder or pass --overwrite")
    if out.exists() and not out.is_dir():
        raise OutputError(f"{out}: exists and is not a folder; remove it or choose another name")
    if out.exists() and not is_earlier_output(out):
        raise OutputError(
            f"{out}: --overwrite only replaces an earlier ckpt-repair output, and this folder has no {REPORT_NAME}; "
            "remove it yourself or choose another folder"
        )
    if not out.parent.is_dir():
        raise OutputError(f"{out.parent}: parent folder does not exist; create it first")


def execute(
    plan: Plan, out: Path, *, overwrite: bool = False, progress: bool | None = None, options: dict | None = None,
    annotate: Callable[[Path], dict] | None = None,
) -> Result:
    """Write the planned checkpoint to `out` atomically and return its report.

    `annotate(folder)` may add report sections computed on the written files (e.g. doctor after); it
    re-opens them under `own_output`, so a defect found there is reported as ours.
    """
    out = Path(out)
    plan_check.check_plan(plan)  # a Plan built or edited outside make_plan (Python API) is checked too
    check_output(plan.source.root, out, overwrite, plan.original.root if plan.original else None)
    try:
        with staged(out) as (tmp, state):
            report = _build(plan, tmp, out, progress, options, annotate)
            publish(tmp, out, state, overwrite)
    except OSError as exc:
        raise _os_error(exc, plan, out) from None
    except EOFError:
        raise BadInput(f"{plan.source.root}: a file got shorter while it was copied; make sure nothing writes to the input, then re-run") from None
    return Result(out, report)


def _build(plan: Plan, tmp: Path, out: Path, progress: bool | None, options: dict | None, annotate) -> dict:
    """Write and check every file inside the temp folder; return the report."""
    with _progress(plan, progress) as bar:
        hashes = _write_all(plan, tmp, bar)
    _self_check(plan, tmp, out, hashes)  # before anything (annotate) reads the written files
    report = build_report(plan, hashes, options or {})
    if annotate is not None:
        report.update(annotate(tmp))
    _write_json(tmp / REPORT_NAME, report)
    apply_modes(tmp, plan.source.root)
    fsync_tree(tmp)
    return report


def _os_error(exc: OSError, plan: Plan, out: Path) -> OutputError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        needed = sum(nbytes(t.out.dtype, t.out.shape) for s in plan.shards for t in s.tensors)
        return OutputError(
            f"{out}: disk full while writing (the output needs about {needed / 1e6:,.1f} MB); nothing was written, "
            f"free space on {out.parent} or choose an -o on another disk, then re-run"
        )
    return OutputError(f"{exc.filename or out}: {exc.strerror or exc}; nothing was written, check the disk, folder and permissions, then re-run")


def _progress(plan: Plan, enabled: bool | None) -> tqdm:
    total = sum(s.size for s in plan.source.shards)
    show = sys.stderr.isatty() if enabled is None else enabled
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="repair", disable=not show, leave=False)


def _write_all(plan: Plan, tmp: Path, bar: tqdm) -> dict[str, dict[str, str]]:
    """Write every output file; return {file: {"source": sha256, "output": sha256}}."""
    root = plan.source.root
    hashes: dict[str, dict[str, str]] = {}
    # Whole-shard copies (kernel copy + sha256 thread each) start at once, two at a time, beside the
    # rewrites: the cores stay busy hashing while the main thread imports torch and computes.
    with ThreadPoolExecutor(2) as copier:
        copies = {s.name: copier.submit(copy_file_hashed, root / s.name, tmp / s.name) for s in plan.shards if s.op == "copy_file"}
        try:
            for step in plan.shards:
                src = root / step.name
                if step.op == "copy_file":
                    digest = copies[step.name].result()
                    hashes[step.name] = {"source": digest, "output": digest}
                else:
                    with ThreadPoolExecutor(1) as pool:  # hash the source on the other core while rewriting
                        source_sha = pool.submit(sha256_file, src)
                        hashes[step.name] = {"output": _rewrite(plan, step, tmp / step.name), "source": source_sha.result()}
                bar.update((root / step.name).stat().st_size)
        except BaseException:
            for pending in copies.values():
                pending.cancel()  # copies not started yet are dropped; running ones finish before the temp folder goes
            raise
    for name in plan.copied_files:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        digest = copy_file_hashed(root / name, tmp / name)
        hashes[name] = {"source": digest, "output": digest}
    for name, content in plan.json_files.items():
        source = root / name
        hashes[name] = {"source": sha256_file(source) if source.exists() else None, "output": _write_json(tmp / name, content)}
    return hashes


def _rewrite(plan: Plan, step: ShardStep, dst: Path) -> str:
    """Stream one changed shard: copy untouched tensors' bytes, compute the changed ones.

    torch (~1.4 s to import) is imported at the first computed tensor, not before: copies already
    written are hashed by the writer's thread meanwhile instead of after.
    """
    located = {"checkpoint": plan.source.locate(), "original": plan.original.locate() if plan.original else {}}
    computer = None
    header = [OutTensor(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors]
    with ShardWriter(dst, header, step.metadata) as writer:
        for t in step.tensors:
            if t.op == "copy":
                shard, info = located[t.source][t.inputs[0]]
                writer.copy(t.out.name, shard.path, info)
            else:
                if computer is None:
                    from repair import formats
                    from repair.execute.compute import Computer

                    divisor = formats.by_name(plan.format).GLOBAL_SCALE_IS_DIVISOR
                    computer = Computer(located["checkpoint"], located["original"], divisor)
                writer.write(t.out.name, computer.bytes_of(t))
    return writer.digest.hexdigest()


def _write_json(path: Path, content: dict) -> str:
    """Write a small JSON file (2-space indent, key order kept, trailing newline); return its sha256."""
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return sha256_file(path)


def _self_check(plan: Plan, tmp: Path, out: Path, hashes: dict) -> None:
    """Re-open every written file and compare it with the plan before anything is published."""
    found = {p.relative_to(tmp).as_posix() for p in tmp.rglob("*") if p.is_file()} - {MARKER}
    if found != set(hashes):
        _check_failed(out, f"written files differ from the plan ({', '.join(sorted(found ^ set(hashes)))})")
    for step in plan.shards:
        try:
            header = read_header(tmp / step.name)
        except RepairError as err:
            _check_failed(out / step.name, f"does not re-open ({_defect(err, tmp, out)})")
        got = [(t.name, t.dtype, t.shape) for t in header.tensors]
        want = [(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors]
        if got != want or header.metadata != step.metadata:
            _check_failed(out / step.name, "written header does not match the plan")
    for name, content in plan.json_files.items():
        if json.loads((tmp / name).read_text(encoding="utf-8")) != content:
            _check_failed(out / name, "written JSON does not match the plan")


@contextmanager
def own_output(folder: Path, shown_as: Path | str) -> Iterator[None]:
    """Around code that re-opens our own output (doctor after): a defect an input check finds there is
    ours, so its advice to the user ("remove the stale shard") and the temp folder's name must not show."""
    try:
        yield
    except BadInput as err:
        raise InternalError("re-opening the written output", _defect(err, folder, shown_as)) from None


def _defect(err: RepairError, folder: Path, shown_as: Path | str) -> str:
    """What an input check found in our own output, without its advice to the user (the part after "; ")."""
    return str(err).replace(str(folder), str(shown_as)).split("; ")[0]


def _check_failed(where: Path, what: str) -> None:
    raise InternalError("the check of the written output", f"{where}: {what}")


def write_rewritten_shard(plan: Plan, step: ShardStep, dst: Path) -> str:
    """One "rewrite" step on its own, written to `dst` and re-checked like execute() checks it; its sha256.

    For publishers that upload file by file instead of writing an output folder (repair/hub): the
    plan's source must hold every shard this step reads.
    """
    digest = _rewrite(plan, step, dst)
    header = read_header(dst)
    if [(t.name, t.dtype, t.shape) for t in header.tensors] != [(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors] \
            or header.metadata != step.metadata:
        _check_failed(dst, "written header does not match the plan")
    return digest


def write_json(path: Path, content: dict) -> str:
    """A small JSON file exactly as execute() writes it; its sha256."""
    return _write_json(path, content)
