"""Plan -> files. Streams tensor bytes, builds the output in a temporary folder beside OUT and
renames it into place only when every file is written and checked. The input is only read.
"""

from __future__ import annotations

import json
import sys
from contextlib import ExitStack, closing, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from repair.planning import check as plan_check
from repair.planning.target_check import cannot_repair, contradiction
from repair.doctor.findings import Severity
from repair.errors import BadInput, InternalError
from repair.execute.copies import WholeCopies
from repair.execute.experts import PLACED, place_experts
from repair.execute.compute import Computer, Located, computed_unit, requantized_module
from repair.execute.parallel import default_jobs, in_order, runs
from repair.io.atomic import WRITTEN, build_atomically, check_files, check_header, defect, own_output, write_json
from repair.io.dtypes import nbytes
from repair.io.hashing import sha256_file, sha256_pinned
from repair.io.progress import byte_bar
from repair.io.ranges import source_of
from repair.io.shard_writer import OutTensor, ShardWriter
from repair.io.staging import PARTIAL_TAG, InterruptGate, remove_stale_partials
from repair.planning.model import Copy, Plan, ShardOp, ShardStep
from repair.execute.report import REPORT_NAME, DoctorRecord, Sections, build_report

__all__ = ["PARTIAL_TAG", "Result", "computer_for", "execute", "remove_stale_partials", "write_rewritten_shard"]


@dataclass(frozen=True)
class Result:
    """What a run produced: the output folder and the report written into it."""

    out: Path
    report: dict


def execute(
    plan: Plan, out: Path, *, overwrite: bool = False, progress: bool | None = None, options: dict | None = None,
    sections: Sections = Sections(), after: Callable[[Path], object] | None = None, jobs: int | None = None,
) -> Result:
    """Write the planned checkpoint to `out` atomically and return its report.

    `sections` are the report's command-specific parts; `after(folder)`, when given, diagnoses the
    written files (doctor after) for the report. It re-opens our own output, so a defect it finds
    there is reported as ours (`own_output`). `jobs` computes that many tensors at once (default: every
    core); the bytes written are the same for every value.
    """
    out = Path(out)
    plan_check.check_plan(plan)  # a Plan built or edited outside make_plan (Python API) is checked too
    original = plan.original.root if plan.original else None
    report = build_atomically(plan.source.root, out, overwrite, lambda tmp, gate: _build(plan, tmp, out, progress, options, sections, after, jobs or default_jobs(), gate),
                              original=original, needed_bytes=lambda: _needed(plan))
    return Result(out, report)


def _build(plan: Plan, tmp: Path, out: Path, progress: bool | None, options: dict | None, sections: Sections, after, jobs: int,
           gate: InterruptGate) -> dict:
    """Write and check every file inside the temp folder; return the report."""
    try:
        with _progress(plan, progress) as bar:
            hashes = _write_all(plan, tmp, bar, jobs, gate)
    except EOFError:  # an input got shorter while it was read: say which
        check_inputs(plan)
        raise
    try:
        _self_check(plan, tmp, out, hashes)  # before anything (doctor after) reads the written files
        if after is not None:
            with own_output(tmp, out):
                sections = sections.with_after(after(tmp))
            for record in sections.doctor:
                refuse_unclean(plan, record, tmp, out)
    except InternalError:  # an input rewritten while read makes a bad copy: that is the input's change (exit 2), not our bug
        check_inputs(plan)
        raise
    report = build_report(plan, hashes, options or {}, sections)
    write_json(tmp / REPORT_NAME, report)
    check_inputs(plan)  # last: whatever changed while it was read, nothing is published
    return report


def refuse_unclean(plan: Plan, doctor: DoctorRecord | None, tmp: Path, out: Path | str) -> None:
    """`fix --target T` (and `hub fix --target T`) promises an output that doctor --strict passes for T. A finding the repair itself introduced
    is ours: exit 3. One the input already had (a broken scale of a kept layer, an exclusion matching nothing, ...)
    is one this target's repair does not clear: refused, exit 2 (planning refuses it first: planning/target_check.py;
    this is the check on what was written). Either way before anything is published."""
    if plan.recipe.from_target is None or doctor is None or doctor.after is None or not doctor.after.exit_code(strict=True):
        return
    before = {(f.code, f.subject) for f in doctor.before.findings}
    left = [f for f in doctor.after.findings if f.severity in (Severity.ERROR, Severity.WARNING)]
    new = [f for f in left if (f.code, f.subject) not in before]
    if new:
        clash = contradiction(plan.source, plan.before, doctor.target.spec, new)  # several targets: one's change, the other's finding
        if clash is not None:
            raise clash
        raise InternalError("doctor --strict on the output", f"{defect(BadInput(new[0].message), tmp, out)} ({len(new)} new finding(s))")
    raise cannot_repair(plan.source.root, doctor.target.spec, left)


def _needed(plan: Plan) -> int:
    return sum(nbytes(t.out.dtype, t.out.shape) for s in plan.shards for t in s.tensors)


def _progress(plan: Plan, enabled: bool | None):
    total = sum(s.size for s in plan.source.shards)
    show = sys.stderr.isatty() if enabled is None else enabled
    return byte_bar(total, "repair", show, divisor=1024)


def _write_all(plan: Plan, tmp: Path, bar, jobs: int, gate: InterruptGate) -> dict[str, dict[str, str]]:
    """Write every output file; return {file: {"source": sha256, "output": sha256}}: each input's over the
    bytes read through its pinned handle, each output's over the bytes written, from the same buffers. Small files
    are copied whole beside the shards, off this thread (no Ctrl-C lands inside their copy)."""
    src = plan.source
    shards = {s.path.name: source_of(s) for s in src.shards}  # the pinned handles (a shard's path may be a Hub mirror's)
    hashes: dict[str, dict[str, str]] = {}
    # Whole-shard copies (read once, hashed as written) start at once beside the rewrites, each copied ahead of
    # its hashing (execute/copies.py): the disk and both cores stay busy while the main thread computes.
    whole = {s.name: (shards[s.name], tmp / s.name) for s in plan.shards if s.op == ShardOp.COPY_FILE}
    for name in plan.copied_files:
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
    small = {name: (src.input(name), tmp / name) for name in plan.copied_files}
    with WholeCopies(whole) as copies, WholeCopies(small, finish=True) as small_copies:
        for step in plan.shards:
            if step.op == ShardOp.COPY_FILE:
                digest = copies.digest(step.name)
                hashes[step.name] = {"source": digest, "output": digest}
            else:
                hashes[step.name] = _rewrite(plan, step, tmp / step.name, jobs=jobs, gate=gate)
            bar.update(shards[step.name].size)
        for name in plan.copied_files:
            digest = small_copies.digest(name)
            hashes[name] = {"source": digest, "output": digest}
    for name, content in plan.json_files.items():
        hashes[name] = {"source": input_sha256(src, name), "output": write_json(tmp / name, content)}
    return hashes


def input_sha256(ckpt, name: str) -> str | None:
    """sha256 of an input file as it was read (a config or index: the bytes parsed at plan time); None if absent."""
    pinned = ckpt.pins.get(ckpt.root / name)
    if pinned is not None:
        return sha256_pinned(pinned)
    path = ckpt.root / name
    return sha256_file(path) if path.exists() else None


def check_inputs(plan) -> None:
    """Every pinned input still the file that was read (io/pins.py): else exit 2, and nothing is published."""
    plan.source.pins.check("SRC")
    if plan.original is not None:
        plan.original.pins.check("--original")


def _rewrite(plan: Plan, step: ShardStep, dst: Path, hash_source: bool = True, jobs: int = 1,
             gate: InterruptGate | None = None) -> dict[str, str | None]:
    """Stream one changed shard: copy untouched tensors' bytes, compute the changed ones; the source's and
    the output's sha256, the source's from the same reads (its other bytes are read as the copy passes them).

    torch (~1.4 s to import) is imported at the first computed tensor that needs it, not before:
    copies already written are hashed by the writer's thread meanwhile instead of after. Computed tensors
    are made `jobs` ahead of the writer (execute/parallel.py). The file opens with `gate`'s signals held until the
    stack owns it: a Ctrl-C between the constructor's return and `with` would leave it open and its hashing running.
    """
    located = located_inputs(plan)
    computer = computer_for(plan, located)
    header = [OutTensor(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors]
    home = next(source_of(s) for s in plan.source.shards if s.path.name == step.name) if hash_source else None
    with ExitStack() as stack:
        with gate.held() if gate is not None else nullcontext():
            writer = stack.enter_context(ShardWriter(dst, header, step.metadata, source=home))

        def made_and_placed(unit):  # on a worker: the result goes into the file there, not on the one writing thread
            if computer.by_expert(unit[0]):  # 3-D experts: expert by expert, each at its offset
                return [place_experts(computer, unit[0].out.name, unit[0], None, [None], [writer])]
            made = computer.unit_bytes(unit)
            for t, data in zip(unit, made):
                writer.place(t.out.name, data)
            return made
        units = in_order(runs(step.tensors, requantized_module), made_and_placed, computed_unit, jobs)
        with closing(units):  # a failed write stops the computing (and placing) before the file is closed
            _write_units(writer, units, located)
    return {"output": writer.digest.hexdigest(), "source": writer.source_digest}


def _write_units(writer: ShardWriter, units, located: dict[str, Located]) -> None:
    """Each unit in order: copied tensors copied, computed ones (placed already) hashed in turn.

    `made` is let go before the next unit is asked for: with jobs=1 that call computes it, and a loop variable still
    holding this one's bytes kept two results alive (with io/hasher.py's last job: 578 MiB peak RSS for two 256 MiB
    tensors, 321 without; tests/test_experts3d_dequant.py)."""
    for unit, made in units:
        _write_unit(writer, unit, made, located)
        del made


def _write_unit(writer: ShardWriter, unit, made, located: dict[str, Located]) -> None:
    for t, data in zip(unit, made or [None] * len(unit)):
        if data is None:
            shard, info = located[t.source][t.inputs[0]]
            writer.copy(t.out.name, source_of(shard), info)
        elif data is PLACED:
            writer.written_in_place(t.out.name)
        else:
            writer.write(t.out.name, data)


def located_inputs(plan: Plan) -> dict[str, Located]:
    """Every input tensor by name, per source ("checkpoint", "original"), with the shard that holds it."""
    return {"checkpoint": plan.source.locate(), "original": plan.original.locate() if plan.original else {}}


def global_scale_is_divisor(plan: Plan) -> bool:
    """compressed-tensors stores 1 / ModelOpt's weight_scale_2: every dequantize of this plan must know."""
    return plan.format.GLOBAL_SCALE_IS_DIVISOR


def computer_for(plan: Plan, located: dict[str, Located]) -> Computer:
    """The one construction of a Computer for a plan (fix, fix --tp, hub fix): the divisor comes from its format."""
    return Computer(located["checkpoint"], located["original"], global_scale_is_divisor(plan))


def _self_check(plan: Plan, tmp: Path, out: Path, hashes: dict) -> None:
    """Re-open every written file and compare it with the plan before anything is published."""
    check_files(tmp, out, set(hashes))
    for step in plan.shards:
        check_header(tmp, out, step.name, _expected(step), step.metadata)
    for name, content in plan.json_files.items():
        if json.loads((tmp / name).read_text(encoding="utf-8")) != content:
            raise InternalError(WRITTEN, f"{out / name}: written JSON does not match the plan")


def _expected(step: ShardStep) -> list[tuple[str, str, tuple[int, ...]]]:
    return [(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors]


def write_rewritten_shard(plan: Plan, step: ShardStep, dst: Path, jobs: int = 1) -> str:
    """One ShardOp.REWRITE step on its own, written to `dst` and re-checked like execute() checks it; its sha256.

    For publishers that upload file by file instead of writing an output folder (repair/hub): the
    plan's source must hold every shard this step reads.
    """
    digest = _rewrite(plan, step, dst, hash_source=False, jobs=jobs)["output"]
    check_header(dst.parent, dst.parent, dst.name, _expected(step), step.metadata)
    return digest
