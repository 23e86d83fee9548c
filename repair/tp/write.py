"""`fix --tp N`: one checkpoint folder per rank, each rank's slices read by byte range.

OUT/rank-R/model.safetensors holds rank R's slice of every tensor of the standard (non-TP)
output, in the same order and under the same names (gate_proj and up_proj stay separate: vLLM
fuses them at load); OUT/rank-R also gets the standard output's config and other small files,
but not its index (that names shards a rank folder does not have). OUT/tp_manifest.json says how
every tensor was split and how to rebuild the standard output (`ckpt-repair unshard`). All of it
is built in a temp folder beside OUT and published by one rename. Memory holds the rank slices of
at most `jobs` computed tensors (execute/parallel.py), of one expert for 3-D experts (execute/experts.py: each
rank's part written at its offset); copies go by byte range, with no buffer.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, closing
from dataclasses import dataclass, replace
from pathlib import Path

from repair.errors import BadInput, InternalError, UsageError
from repair.execute.copies import WholeCopies
from repair.execute.experts import PLACED, place_experts
from repair.execute.compute import NUMPY_ONLY, requantized_module
from repair.execute.parallel import default_jobs, in_order, runs
from repair.execute.writer import check_inputs, computer_for, global_scale_is_divisor, input_sha256, located_inputs
from repair.io.atomic import build_atomically, check_files, check_header, check_output, write_json
from repair.io.dtypes import nbytes
from repair.io.hasher import SharedHashers
from repair.io.hashing import SourceDigest
from repair.io.pins import open_files_allowed
from repair.io.progress import byte_bar
from repair.io.ranges import read_tensor, source_of
from repair.io.safetensors import TensorInfo
from repair.io.shard_writer import OutTensor, ShardWriter
from repair.io.staging import InterruptGate
from repair.execute.report import REPORT_NAME, Sections, TpRecord, build_report, input_sections, recipe_options
from repair.planning.model import Copy, Dequantize, Plan, Requantize
from repair.planning.text import plan_as_json, plan_as_text
from repair.tp.plan import BLOCK, TpPlan, TpTensor, plan_tp, summary_text
from repair.tp.manifest import MANIFEST, RANK_FILE, rank_folder, read_manifest
from repair.tp.record import index_name, manifest as tp_manifest
from repair.tp.io import contiguous, read_slice, sub_range
from repair.tp.rank_digests import open_files_needed
from repair.tp.source_digests import SourceDigests

CHECK = "the check of the written per-rank output"


@dataclass(frozen=True)
class TpResult:
    out: Path
    manifest: dict
    report: dict


def write_tp(tpp: TpPlan, out: Path, *, overwrite: bool = False, progress: bool | None = None, options: dict | None = None,
             sections: Sections = Sections(), jobs: int | None = None) -> TpResult:
    """Write the per-rank checkpoints, the manifest and the report to `out`, atomically; `jobs` tensors computed at once."""
    plan = tpp.plan
    _check_open_files(tpp)

    def build(tmp: Path, gate: InterruptGate) -> TpResult:
        try:
            rank_hashes, sources = _write_ranks(tpp, tmp, gate, progress, jobs or default_jobs())
        except EOFError:  # an input got shorter while it was read: say which
            check_inputs(plan)
            raise
        manifest = tp_manifest(tpp, rank_hashes, tmp)
        outputs = {f"{rank_folder(r)}/{n}": {"source": None, "output": h} for r, files in rank_hashes.items() for n, h in files.items()}
        outputs[MANIFEST] = {"source": None, "output": write_json(tmp / MANIFEST, manifest)}
        split = replace(sections, tp=TpRecord(tpp.tp, tpp.source, MANIFEST), source_files=tuple(sources.items()))
        report = build_report(plan, outputs, {**(options or {}), "tp": tpp.tp}, split)
        write_json(tmp / REPORT_NAME, report)
        _self_check(tpp, tmp, out, set(outputs) | {REPORT_NAME})
        check_inputs(plan)  # last: whatever changed while it was read, nothing is published
        return TpResult(out, manifest, report)

    return build_atomically(plan.source.root, out, overwrite, build, original=_original_root(plan))


def _check_open_files(tpp: TpPlan) -> None:
    """Every rank file is open at once, beside the input's shards and a few more: past what this process may open,
    one line before anything is written (not `Too many open files` blamed on the disk, minutes in)."""
    needed = open_files_needed(tpp.tp + len(tpp.plan.shards), tpp.tp)
    allowed = open_files_allowed(needed)
    if allowed < needed:
        raise UsageError(f"--tp {tpp.tp} keeps {tpp.tp} rank files open at once beside {needed - tpp.tp} others, and this "
                         f"process may open {allowed} (ulimit -n, hard limit); raise it or choose a smaller --tp")


def _original_root(plan) -> Path | None:
    original = getattr(plan, "original", None)
    return original.root if original is not None else None


def _write_ranks(tpp: TpPlan, tmp: Path, gate: InterruptGate, progress: bool | None,
                 jobs: int = 1) -> tuple[dict[int, dict[str, str]], dict[str, str]]:
    """Every rank's tensor file (tensor by tensor, rank by rank) and small files: the sha256 of each file written, and
    of each input file read (by name, sorted), both from the same reads. Computed tensors are made `jobs` ahead of the
    writers (execute/parallel.py); the small files are copied beside them, off this thread (execute/copies.py).

    A rank file opens with signals held until the stack owns it: a Ctrl-C between its opening and `enter_context`
    would leave its file open and its hashing running."""
    plan, tp = tpp.plan, tpp.tp
    first_meta = next((s.metadata for s in plan.shards if s.metadata), None) or {}
    total = sum(nbytes(t.step.out.dtype, t.step.out.shape) for t in tpp.tensors)
    show = progress if progress is not None else os.isatty(2)
    small = _small_copies(plan, tmp, tp)
    with WholeCopies(small, finish=True) as copies:
        with ExitStack() as stack, byte_bar(total, "tp", show) as bar:
            writers, hashers = [], stack.enter_context(SharedHashers(tp, gate.held))  # drained after every writer closed
            for rank in range(tp):
                header = [OutTensor(t.step.out.name, t.step.out.dtype, t.rank_shape(_range(t, rank, tp))) for t in tpp.tensors]
                meta = {**first_meta, "format": first_meta.get("format", "pt"), "tp_rank": str(rank), "tp_size": str(tp)}
                with gate.held():
                    writer = ShardWriter(tmp / rank_folder(rank) / RANK_FILE, header, meta, hasher=hashers.of(rank))
                    writers.append(stack.enter_context(writer))
            reads = stack.enter_context(SourceDigests(plan, gate))  # opens nothing until its first shard
            slicer = _Slicer(plan, tp, writers)
            units = in_order(runs(tpp.tensors, lambda t: requantized_module(t.step)), slicer.parts, lambda u: any(map(slicer.needs_bytes, u)), jobs)
            stack.enter_context(closing(units))  # a failed write stops the computing at once
            for unit, made in units:
                for t, parts in zip(unit, made or [None] * len(unit)):
                    slicer.write(t, writers, parts, reads.of(t.shard))
                    bar.update(nbytes(t.step.out.dtype, t.step.out.shape))
        copied = {name: copies.digest(name) for name in small}
    hashes = {rank: {RANK_FILE: writer.digest.hexdigest()} for rank, writer in enumerate(writers)}
    for name in (n for n in plan.copied_files if n != index_name(plan)):
        for rank in range(tp):
            hashes[rank][name] = copied[f"{rank_folder(rank)}/{name}"]
    for name, content in plan.json_files.items():
        if name != index_name(plan):
            for rank in range(tp):
                hashes[rank][name] = write_json(tmp / rank_folder(rank) / name, content)
    return hashes, _input_hashes(plan, reads, copied)


def _small_copies(plan, tmp: Path, tp: int) -> dict[str, tuple]:
    """Every rank's copy of the files the standard output copies whole (but its index), by output name, in rank order;
    the rank folders are made here."""
    index, jobs = index_name(plan), {}
    for rank in range(tp):
        (tmp / rank_folder(rank)).mkdir()
        for name in plan.copied_files:
            if name != index:
                (tmp / rank_folder(rank) / name).parent.mkdir(parents=True, exist_ok=True)
                jobs[f"{rank_folder(rank)}/{name}"] = (plan.source.input(name), tmp / rank_folder(rank) / name)
    return jobs


def _input_hashes(plan, reads: SourceDigests, copied: dict[str, str]) -> dict[str, str | None]:
    """Each input file's sha256 by name, sorted: a shard's from the copies' reads, a copied file's from rank 0's copy
    (the bytes read), a config or index's of the bytes parsed at plan time."""
    hashes: dict[str, str | None] = {s.name: reads.sha256(s.name) for s in plan.shards}
    hashes.update((n, copied.get(f"{rank_folder(0)}/{n}") or input_sha256(plan.source, n)) for n in plan.copied_files)
    hashes.update((n, input_sha256(plan.source, n)) for n in plan.json_files if (plan.source.root / n).exists())
    return dict(sorted(hashes.items()))


def _range(t: TpTensor, rank: int, tp: int):
    ranges = t.spec.ranges(tp)
    return ranges[rank] if ranges else None


class _Slicer:
    """Produces each rank's bytes of one planned tensor; copies need no torch, computed ops import it.

    Whole computed tensors come from the plan's Computer, slices are dequantized here: both take the
    global scale's meaning (multiplier or divisor) from the plan's format, as `fix` does.
    """

    def __init__(self, plan: Plan, tp: int, writers: list[ShardWriter]):
        self.tp, self.writers = tp, writers
        self.located = located_inputs(plan)
        self.computer = computer_for(plan, self.located)
        self.divisor = global_scale_is_divisor(plan)

    def needs_bytes(self, t: TpTensor) -> bool:
        """Computed, or a copy some rank cannot take as one byte range: its bytes are made before writing."""
        return not all(self._copied(t, _range(t, rank, self.tp)) for rank in range(self.tp))

    def parts(self, unit: tuple[TpTensor, ...]) -> list[list | None]:
        """Each tensor's bytes per rank (None: a rank copies its byte range when written; PLACED: 3-D experts, written
        into the rank files expert by expert here); any thread."""
        try:
            return [self._placed(t) if self.computer.by_expert(t.step) else self._rank_parts(t) if self.needs_bytes(t) else None
                    for t in unit]
        finally:
            self.computer.forget()

    def _placed(self, t: TpTensor) -> str:
        ranks = [_range(t, rank, self.tp) for rank in range(self.tp)]
        return place_experts(self.computer, t.step.out.name, t.step, t.spec.dim, ranks, self.writers)

    def _rank_parts(self, t: TpTensor) -> list:
        source = getattr(t.step, "source", "checkpoint")
        whole = self.computer.tensor(t.step) if _made_whole(t.step) else None  # the others are sliced before they are made
        ranks = [_range(t, rank, self.tp) for rank in range(self.tp)]
        return [None if self._copied(t, rng) else self._rank_bytes(t, rng, source, whole) for rng in ranks]

    def _copied(self, t: TpTensor, rng) -> bool:
        return isinstance(t.step, Copy) and (t.spec.dim is None or (rng is not None and contiguous(t.step.out.shape, t.spec.dim)))

    def write(self, t: TpTensor, writers: list[ShardWriter], parts: list | None, digest: SourceDigest | None = None) -> None:
        """Write one tensor to every rank: its made bytes, else its stored bytes by range (no buffer at all). The copies
        feed `digest` each input byte once, in file order: a replicated tensor's from rank 0, a split one's from each rank."""
        step, name = t.step, t.step.out.name
        if parts == PLACED:
            for w in writers:
                w.written_in_place(name)
            return
        shard, info = self.located[getattr(step, "source", "checkpoint")][step.inputs[0]]
        for rank, w in enumerate(writers):
            if parts is not None and parts[rank] is not None:
                w.write(name, parts[rank])
            elif t.spec.dim is None:
                w.copy(name, source_of(shard), info, digest if rank == 0 else None)
            else:
                w.copy(name, source_of(shard), sub_range(info, t.spec.dim, *_range(t, rank, self.tp).stored), digest)

    def _rank_bytes(self, t: TpTensor, rng, source: str, whole):
        from repair.io import tensors

        step, dim = t.step, t.spec.dim
        if whole is not None:
            part = whole if rng is None else whole.narrow(dim, rng.stored[0], rng.stored[1] - rng.stored[0])
            return tensors.to_bytes(part)
        if isinstance(step, Dequantize):
            return tensors.to_bytes(self._dequantized(step, source, dim, rng))
        shard, info = self.located[source][step.inputs[0]]
        data = read_slice(source_of(shard), info, dim, *rng.stored) if rng else read_tensor(shard, info)
        if isinstance(step, Copy):
            return data
        part = _as_tensor(data, info.dtype, t.rank_shape(rng) if rng else info.shape)
        return tensors.to_bytes(part.to(tensors.TORCH_DTYPE[step.out.dtype]))  # cast

    def _dequantized(self, step, source: str, dim: int | None, rng):
        """Dequantize only this rank's rows, or its columns widened to whole 16-element blocks, then trimmed."""
        from repair.codec import nvfp4
        from repair.io import tensors

        (ps, packed), (ss, scale), (gs, scale_2) = (self.located[source][n] for n in step.inputs)
        rows = packed.shape[0]
        lo, hi = rng.logical if rng else (0, rows)  # replicated: every row
        if dim == 1:
            a0, b0 = lo - lo % BLOCK, -(-hi // BLOCK) * BLOCK
            p = _as_tensor(read_slice(source_of(ps), packed, 1, a0 // 2, b0 // 2), "U8", (rows, (b0 - a0) // 2))
            s = _as_tensor(read_slice(source_of(ss), scale, 1, a0 // BLOCK, b0 // BLOCK), scale.dtype, (rows, (b0 - a0) // BLOCK))
        else:
            p = _as_tensor(read_slice(source_of(ps), packed, 0, lo, hi), "U8", (hi - lo, packed.shape[1]))
            s = _as_tensor(read_slice(source_of(ss), scale, 0, lo, hi), scale.dtype, (hi - lo, scale.shape[1]))
        g = _as_tensor(read_tensor(gs, scale_2), scale_2.dtype, scale_2.shape)
        out = nvfp4.dequantize(p, s, g, tensors.TORCH_DTYPE[step.out.dtype], divisor=self.divisor)
        return out[:, lo - a0: hi - a0] if dim == 1 else out


def _made_whole(step) -> bool:
    """Requantized tensors, dequantized FP8 / NVFP4_AWQ weights (one module's tensor, on numpy) and 3-D NVFP4 experts
    the table does not take (the torch path) are made whole by the plan's Computer and then sliced; 2-D NVFP4 is
    dequantized slice by slice, 3-D experts on the table path expert by expert (execute/experts.py)."""
    return isinstance(step, Requantize) or (isinstance(step, Dequantize) and (step.algorithm in NUMPY_ONLY or len(step.out.shape) == 3))


def _as_tensor(data: bytearray, dtype: str, shape):
    from repair.io import tensors

    return tensors.from_bytes(data, TensorInfo("", dtype, tuple(shape), 0, nbytes(dtype, tuple(shape))))


def _self_check(tpp: TpPlan, tmp: Path, out: Path, expected: set[str]) -> None:
    """Re-open every rank file and compare its header with the plan before anything is published."""
    check_files(tmp, out, expected, CHECK)
    for rank in range(tpp.tp):
        want = [(t.step.out.name, t.step.out.dtype, t.rank_shape(_range(t, rank, tpp.tp))) for t in tpp.tensors]
        check_header(tmp, out, f"{rank_folder(rank)}/{RANK_FILE}", want, check=CHECK)
    try:
        read_manifest(tmp)
    except BadInput as err:
        raise InternalError(CHECK, f"{out / MANIFEST}: `unshard` would refuse it ({err})") from None


def fix_tp(plan, out: Path, tp: int, *, dry_run: bool = False, overwrite: bool = False, progress: bool | None = None,
           force: bool = False, jobs: int | None = None, detail: str = "normal") -> tuple[dict, str]:
    """`fix --tp N`: refuse an impossible degree before anything is written, then write; returns (json, text)."""
    tpp = plan_tp(plan, tp)
    check_output(plan.source.root, out, overwrite, _original_root(plan))
    info = {"degree": tp, "parallel_plan": tpp.source, "styles": tpp.counts()}
    text = plan_as_text(plan, detail == "verbose") + "\n" + summary_text(tpp)
    if dry_run:
        return {"status": "dry-run", "plan": plan_as_json(plan), "tp": info}, text + "\n(dry run: nothing written)"
    # doctor on the input at this degree (the output is per-rank: `unshard` it to doctor the result)
    jobs = jobs or default_jobs()
    sections = input_sections(plan, force, tp, jobs)
    result = write_tp(tpp, out, overwrite=overwrite, progress=progress, options=recipe_options(plan), sections=sections, jobs=jobs)
    wrote = f"wrote {result.out}: {rank_folder(0)} .. {rank_folder(tp - 1)}, manifest {result.out / MANIFEST}"
    text = wrote if detail == "quiet" else f"{wrote}\n{text}"  # the summary first, as `fix` prints it
    return {"status": "written", "out": str(result.out), "plan": plan_as_json(plan), "tp": info}, text
