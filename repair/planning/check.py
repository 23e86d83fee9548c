"""The complete check of a plan, run before anything is read or written, so a plan that `--dry-run`
accepts is one the writer can write.

A plan is ours, whatever the input: every failure here is an InternalError (a bug in ckpt-repair).
It checks the output's tensor set (every tensor once, in one shard; nothing of the input lost
unless a change says so), each shard step against what the writer does with it, the output's file
names, and the index against the shards. The `--tp` layout's check is repair/tp/check.py (it knows
the rank files' name, which is TP's).
"""

from __future__ import annotations

from repair.errors import InternalError
from repair.formats import detect
from repair.io.checkpoint import HF_QUANT_CONFIG
from repair.io.names import plain_name
from repair.io.dtypes import nbytes
from repair.io.output import REPORT_NAME
from repair.planning.model import DEQUANTIZE_INPUTS, Cast, Copy, Dequantize, Plan, Requantize, ShardOp, ShardStep, TensorStep

CHECK = "the plan check"


def check_plan(plan: Plan) -> None:
    """Raise InternalError naming the first thing in `plan` the writer would refuse or get wrong."""
    _check_format(plan)
    _check_files(plan)
    placed = _placed_tensors(plan)
    _check_tensor_set(plan, placed)
    sources = {"checkpoint": plan.source.infos(), "original": plan.original.infos() if plan.original else {}}
    for step in plan.shards:
        _check_step(plan, step, sources)
    _check_index(plan, placed)


def failed(detail: str) -> InternalError:
    return InternalError(CHECK, detail)


def _check_format(plan: Plan) -> None:
    """The plan's format is its source's: it decides whether a global scale multiplies or divides."""
    stored = detect(plan.source)
    if plan.format is not stored:
        raise failed(f"the plan holds format {plan.format.NAME} but its source is stored as {stored.NAME}")


def _check_files(plan: Plan) -> None:
    """Output names unique, plain relative paths, never the report's; removed files are source files not written."""
    written = [s.name for s in plan.shards] + list(plan.json_files) + list(plan.copied_files)
    seen: set[str] = set()
    for name in written:
        if not plain_name(name) or name == REPORT_NAME:
            raise failed(f"output file name {name!r} is not a plain file name inside OUT")
        if name in seen:
            raise failed(f"output file {name} is planned twice")
        seen.add(name)
    removable = {s.path.name for s in plan.source.shards} | ({HF_QUANT_CONFIG} if plan.source.hf_quant_config is not None else set())
    for name in plan.removed_files:
        if name in seen:
            raise failed(f"{name} is planned both as removed and as written")
        if name not in removable:
            raise failed(f"{name} is planned as removed but is not a shard or config file of the source")


def _placed_tensors(plan: Plan) -> dict[str, str]:
    """Output tensor -> its shard; each tensor may appear once, in one shard."""
    placed: dict[str, str] = {}
    for step in plan.shards:
        for t in step.tensors:
            if t.out.name in placed:
                where = step.name if placed[t.out.name] == step.name else f"{placed[t.out.name]} and {step.name}"
                raise failed(f"tensor {t.out.name} is planned twice (in {where})")
            placed[t.out.name] = step.name
    return placed


def _check_tensor_set(plan: Plan, placed: dict[str, str]) -> None:
    """The output holds exactly the input's tensors, minus the changed modules' before, plus their after."""
    before = {t.name for c in plan.changes for t in c.before}
    want = {n for s in plan.source.shards for n in (t.name for t in s.tensors) if n not in before}
    want |= {t.name for c in plan.changes for t in c.after}
    missing, extra = sorted(want - placed.keys()), sorted(placed.keys() - want)
    if missing:
        raise failed(f"tensor {missing[0]} is in no output shard" + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if extra:
        raise failed(f"tensor {extra[0]} is written but neither kept from the input nor produced by a change")


def _check_step(plan: Plan, step: ShardStep, sources: dict[str, dict]) -> None:
    """A whole-file copy is exactly its source shard; a rewrite writes something; every input exists."""
    if step.op == ShardOp.COPY_FILE:
        shard = next((s for s in plan.source.shards if s.path.name == step.name), None)
        stored = [(t.name, t.dtype, t.shape) for t in shard.tensors] if shard else None
        planned = [(t.out.name, t.out.dtype, t.out.shape) for t in step.tensors if isinstance(t, Copy) and t.inputs == (t.out.name,)]
        if stored != planned or len(planned) != len(step.tensors):
            raise failed(f"{step.name} is planned as a whole-file copy but its planned tensors differ from the source shard")
        return
    if step.op != ShardOp.REWRITE or not step.tensors:
        raise failed(f"{step.name}: a shard step must copy a source shard or rewrite it with at least one tensor")
    for t in step.tensors:
        if not isinstance(t, TensorStep):
            raise failed(f"{step.name}: a planned tensor is a {type(t).__name__}, not one of the tensor steps the writer knows")
        found = sources.get(t.source, {})
        absent = [name for name in t.inputs if name not in found]
        if absent:
            raise failed(f"{step.name}: {t.out.name} reads {absent[0]}, which the {t.source} does not store")
        info = found[t.inputs[0]]
        if isinstance(t, Copy) and (info.dtype, info.shape) != (t.out.dtype, t.out.shape):
            raise failed(f"{step.name}: {t.out.name} is a copy of {info.name} but planned with another dtype or shape")
        if not _sizes_fit(t, [_count(found[n].shape) for n in t.inputs]):
            raise failed(f"{step.name}: {t.out.name} ({t.op}) cannot be made from {', '.join(t.inputs)}: their sizes do not fit")


def _count(shape: tuple[int, ...]) -> int:
    total = 1
    for n in shape:
        total *= n
    return total


def _sizes_fit(t: TensorStep, inputs: list[int]) -> bool:
    """Element counts of a computed step's inputs against its output: NVFP4 packs 2 values a byte and one scale per 16."""
    out = _count(t.out.shape)
    if isinstance(t, Dequantize):
        return _dequantize_fits(t, out, inputs)
    if isinstance(t, Cast):
        return inputs == [out]
    if isinstance(t, Requantize) and t.algorithm == "FP8":
        return {"weight": inputs[0] == out, "weight_scale": out == 1}.get(t.role, False)
    if isinstance(t, Requantize):
        return {"weight": inputs[0] == 2 * out, "weight_scale": inputs[0] == 16 * out, "weight_scale_2": out == 1}.get(t.role, False)
    return True


def _dequantize_fits(t: Dequantize, out: int, inputs: list[int]) -> bool:
    """FP8: one value per output element and one scale (FP8 block: one per 128x128 block); NVFP4 (and its variants): 2 a byte, a scale per 16, one
    global scale, and for NVFP4_AWQ one pre_quant_scale per input column."""
    if len(inputs) != len(DEQUANTIZE_INPUTS.get(t.algorithm, ())):
        return False
    if t.algorithm == "FP8":
        return inputs == [out, 1]
    if t.algorithm == "FP8_BLOCK":  # one scale per 128x128 block of the [out, in] weight
        rows, cols = t.out.shape if len(t.out.shape) == 2 else (0, 0)
        return inputs == [out, -(-rows // 128) * -(-cols // 128)] and out > 0
    awq = t.algorithm != "NVFP4_AWQ" or (len(t.out.shape) == 2 and inputs[3] == t.out.shape[1])
    return out == 2 * inputs[0] and out == 16 * inputs[1] and inputs[2] == 1 and awq


def _check_index(plan: Plan, placed: dict[str, str]) -> None:
    """The index OUT will hold maps every output tensor to its shard; a rewritten one also states the total size."""
    name = plan.source.index_name
    if name is None:
        return
    if name in plan.json_files:
        index = plan.json_files[name]
        total = sum(nbytes(t.out.dtype, t.out.shape) for s in plan.shards for t in s.tensors)
        if (index.get("metadata") or {}).get("total_size") != total:
            raise failed(f"{name}: total_size is not the planned shards' {total} bytes")
    elif name in plan.copied_files:
        index = plan.source.index
    else:
        raise failed(f"{name}: the source's index is neither rewritten nor copied")
    if index.get("weight_map") != placed:
        wrong = sorted(set(index.get("weight_map", {}).items()) ^ set(placed.items()))
        raise failed(f"{name}: weight_map disagrees with the planned shards (first: {wrong[0][0] if wrong else '?'})")
