"""`fix --tp N`: one checkpoint folder per rank, each rank's slices read by byte range.

OUT/rank-R/model.safetensors holds rank R's slice of every tensor of the standard (non-TP)
output, in the same order and under the same names (gate_proj and up_proj stay separate: vLLM
fuses them at load); OUT/rank-R also gets the standard output's config and other small files,
but not its index (that names shards a rank folder does not have). OUT/tp_manifest.json says how
every tensor was split and how to rebuild the standard output (`ckpt-repair unshard`). All of it
is built in a temp folder beside OUT and published by one rename. Memory holds the rank slices of
at most `jobs` computed tensors (execute/parallel.py); copies go by byte range, with no buffer.
"""

from __future__ import annotations

import os
from contextlib import ExitStack, closing
from dataclasses import dataclass, replace
from pathlib import Path


from repair.errors import BadInput, InternalError
from repair.execute.compute import NUMPY_ONLY, requantized_module
from repair.execute.parallel import default_jobs, in_order, runs
from repair.execute.writer import check_inputs, computer_for, global_scale_is_divisor, input_sha256, located_inputs
from repair.io.atomic import build_atomically, check_files, check_header, check_output, json_text, write_json
from repair.io.dtypes import nbytes
from repair.io.hashing import copy_file_hashed, sha256_pinned
from repair.io.names import path_text
from repair.io.progress import byte_bar
from repair.io.ranges import read_tensor, source_of
from repair.io.safetensors import TensorInfo
from repair.io.shard_writer import OutTensor, ShardWriter, encode_header
from repair.execute.report import REPORT_NAME, Sections, TpRecord, build_report, input_sections, recipe_options
from repair.planning.model import Copy, Dequantize, Plan, Requantize, ShardOp
from repair.planning.text import plan_as_json, plan_as_text
from repair.tp.plan import BLOCK, VOCAB_PADDING, TpPlan, TpTensor, plan_tp, summary_text
from repair.tp.manifest import FORMAT, MANIFEST, RANK_FILE, rank_folder, read_manifest
from repair.tp.io import contiguous, read_slice, sub_range

CHECK = "the check of the written per-rank output"
VOCAB_NOTE = (f"vLLM pads the vocabulary to a multiple of {VOCAB_PADDING} and gives each rank padded/tp rows; only real rows "
              "are stored, so rank r holds rows [r*padded/tp, min((r+1)*padded/tp, vocab)) and the last rank(s) may be short "
              "(vLLM zero-fills its padding rows at load)")


@dataclass(frozen=True)
class TpResult:
    out: Path
    manifest: dict
    report: dict


def write_tp(tpp: TpPlan, out: Path, *, overwrite: bool = False, progress: bool | None = None, options: dict | None = None,
             sections: Sections = Sections(), jobs: int | None = None) -> TpResult:
    """Write the per-rank checkpoints, the manifest and the report to `out`, atomically; `jobs` tensors computed at once."""
    plan = tpp.plan

    def build(tmp: Path) -> TpResult:
        try:
            rank_hashes = _write_ranks(tpp, tmp, progress, jobs or default_jobs())
        except EOFError:  # an input got shorter while it was read: say which
            check_inputs(plan)
            raise
        manifest = _manifest(tpp, rank_hashes)
        outputs = {f"{rank_folder(r)}/{n}": {"source": None, "output": h} for r, files in rank_hashes.items() for n, h in files.items()}
        outputs[MANIFEST] = {"source": None, "output": write_json(tmp / MANIFEST, manifest)}
        sources = tuple((n, _source_sha256(plan, n)) for n in _source_files(plan))
        split = replace(sections, tp=TpRecord(tpp.tp, tpp.source, MANIFEST), source_files=sources)
        report = build_report(plan, outputs, {**(options or {}), "tp": tpp.tp}, split)
        write_json(tmp / REPORT_NAME, report)
        _self_check(tpp, tmp, out, set(outputs) | {REPORT_NAME})
        check_inputs(plan)  # last: whatever changed while it was read, nothing is published
        return TpResult(out, manifest, report)

    return build_atomically(plan.source.root, out, overwrite, build, original=_original_root(plan))


def _original_root(plan) -> Path | None:
    original = getattr(plan, "original", None)
    return original.root if original is not None else None


def _source_files(plan) -> list[str]:
    names = [s.name for s in plan.shards] + list(plan.copied_files) + [n for n in plan.json_files if (plan.source.root / n).exists()]
    return sorted(set(names))


def _source_sha256(plan, name: str) -> str:
    """An input's sha256 through its pinned handle (a config or index: of the bytes parsed at plan time)."""
    shard = next((s for s in plan.source.shards if s.path.name == name), None)
    return sha256_pinned(source_of(shard)) if shard is not None else input_sha256(plan.source, name)


def _index_name(plan) -> str | None:
    name = plan.source.index_name
    return name if name and (name in plan.json_files or name in plan.copied_files) else None


def _write_ranks(tpp: TpPlan, tmp: Path, progress: bool | None, jobs: int = 1) -> dict[int, dict[str, str]]:
    """Every rank's tensor file (tensor by tensor, rank by rank) and small files; sha256 per file. Computed tensors
    are made `jobs` ahead of the writers (execute/parallel.py)."""
    plan, tp = tpp.plan, tpp.tp
    first_meta = next((s.metadata for s in plan.shards if s.metadata), None) or {}
    slicer = _Slicer(plan, tp)
    total = sum(nbytes(t.step.out.dtype, t.step.out.shape) for t in tpp.tensors)
    show = progress if progress is not None else os.isatty(2)
    hashes: dict[int, dict[str, str]] = {}
    with ExitStack() as stack, byte_bar(total, "tp", show) as bar:
        writers = []
        for rank in range(tp):
            folder = tmp / rank_folder(rank)
            folder.mkdir()
            header = [OutTensor(t.step.out.name, t.step.out.dtype, t.rank_shape(_range(t, rank, tp))) for t in tpp.tensors]
            meta = {**first_meta, "format": first_meta.get("format", "pt"), "tp_rank": str(rank), "tp_size": str(tp)}
            writers.append(stack.enter_context(ShardWriter(folder / RANK_FILE, header, meta)))
        units = in_order(runs(tpp.tensors, lambda t: requantized_module(t.step)), slicer.parts, lambda u: any(map(slicer.needs_bytes, u)), jobs)
        stack.enter_context(closing(units))  # a failed write stops the computing at once
        for unit, made in units:
            for t, parts in zip(unit, made or [None] * len(unit)):
                slicer.write(t, writers, parts)
                bar.update(nbytes(t.step.out.dtype, t.step.out.shape))
    for rank, writer in enumerate(writers):
        hashes[rank] = {RANK_FILE: writer.digest.hexdigest(), **_small_files(plan, tmp / rank_folder(rank))}
    return hashes


def _range(t: TpTensor, rank: int, tp: int):
    ranges = t.spec.ranges(tp)
    return ranges[rank] if ranges else None


def _small_files(plan, folder: Path) -> dict[str, str]:
    """The standard output's config and other small files, minus its index."""
    index, hashes = _index_name(plan), {}
    for name in plan.copied_files:
        if name != index:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            hashes[name] = copy_file_hashed(plan.source.input(name), folder / name)
    for name, content in plan.json_files.items():
        if name != index:
            hashes[name] = write_json(folder / name, content)
    return hashes


class _Slicer:
    """Produces each rank's bytes of one planned tensor; copies need no torch, computed ops import it.

    Whole computed tensors come from the plan's Computer, slices are dequantized here: both take the
    global scale's meaning (multiplier or divisor) from the plan's format, as `fix` does.
    """

    def __init__(self, plan: Plan, tp: int):
        self.tp = tp
        self.located = located_inputs(plan)
        self.computer = computer_for(plan, self.located)
        self.divisor = global_scale_is_divisor(plan)

    def needs_bytes(self, t: TpTensor) -> bool:
        """Computed, or a copy some rank cannot take as one byte range: its bytes are made before writing."""
        return not all(self._copied(t, _range(t, rank, self.tp)) for rank in range(self.tp))

    def parts(self, unit: tuple[TpTensor, ...]) -> list[list | None]:
        """Each tensor's bytes per rank (None: a rank copies its byte range when written); any thread."""
        try:
            return [self._rank_parts(t) if self.needs_bytes(t) else None for t in unit]
        finally:
            self.computer.forget()

    def _rank_parts(self, t: TpTensor) -> list:
        source = getattr(t.step, "source", "checkpoint")
        whole = self.computer.tensor(t.step) if _made_whole(t.step) else None  # the others are sliced before they are made
        ranks = [_range(t, rank, self.tp) for rank in range(self.tp)]
        return [None if self._copied(t, rng) else self._rank_bytes(t, rng, source, whole) for rng in ranks]

    def _copied(self, t: TpTensor, rng) -> bool:
        return isinstance(t.step, Copy) and (t.spec.dim is None or (rng is not None and contiguous(t.step.out.shape, t.spec.dim)))

    def write(self, t: TpTensor, writers: list[ShardWriter], parts: list | None) -> None:
        """Write one tensor to every rank: its made bytes, else its stored bytes by range (no buffer at all)."""
        step, name = t.step, t.step.out.name
        shard, info = self.located[getattr(step, "source", "checkpoint")][step.inputs[0]]
        for rank, w in enumerate(writers):
            if parts is not None and parts[rank] is not None:
                w.write(name, parts[rank])
            elif t.spec.dim is None:
                w.copy(name, source_of(shard), info)
            else:
                w.copy(name, source_of(shard), sub_range(info, t.spec.dim, *_range(t, rank, self.tp).stored))

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
    (transposed per expert, codec/nvfp4.py) are made whole by the plan's Computer and then sliced; 2-D NVFP4 is
    dequantized slice by slice."""
    return isinstance(step, Requantize) or (isinstance(step, Dequantize) and (step.algorithm in NUMPY_ONLY or len(step.out.shape) == 3))


def _as_tensor(data: bytearray, dtype: str, shape):
    from repair.io import tensors

    return tensors.from_bytes(data, TensorInfo("", dtype, tuple(shape), 0, nbytes(dtype, tuple(shape))))


def _manifest(tpp: TpPlan, rank_hashes: dict[int, dict[str, str]]) -> dict:
    """What each rank holds, and how to rebuild the standard output byte for byte."""
    plan = tpp.plan
    return {
        "format": FORMAT, "version": 1, "tp": tpp.tp, "source": path_text(plan.source.root),
        "parallel_plan": tpp.source, "vocab_padding": VOCAB_NOTE,
        "ranks": [{"rank": r, "folder": rank_folder(r), "files": files} for r, files in sorted(rank_hashes.items())],
        "standard": {"shards": [_shard_entry(plan, s) for s in plan.shards],
                     "files": sorted(n for n in rank_hashes[0] if n != RANK_FILE), "index": _index_entry(plan)},
        "tensors": {t.step.out.name: t.entry(tpp.tp) for t in tpp.tensors},
    }


def _shard_entry(plan, step) -> dict:
    """A standard shard: its tensors in order and metadata; a copied shard whose header is not canonical keeps it verbatim."""
    entry = {"name": step.name, "metadata": step.metadata, "tensors": [t.out.name for t in step.tensors]}
    if step.op == ShardOp.COPY_FILE:
        shard = next(s for s in plan.source.shards if s.path.name == step.name)
        raw = bytes(source_of(shard).read(0, shard.data_start))  # the header as pinned at plan time
        canonical = encode_header([OutTensor(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors], step.metadata)
        if raw != canonical:
            entry["header"] = raw[8:].decode("utf-8")
    return entry


def _index_entry(plan) -> dict | None:
    name = _index_name(plan)
    if name is None:
        return None
    pinned = None if name in plan.json_files else plan.source.input(name)
    text = json_text(plan.json_files[name]) if pinned is None else bytes(pinned.read(0, pinned.size)).decode("utf-8")
    return {"name": name, "text": text}


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
