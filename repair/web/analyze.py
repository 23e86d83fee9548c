"""The page's first answer for a source: doctor's verdict (its exact text), the module table, the
findings by severity and the plan with the bytes it moves. Runs in a worker process (repair.web.worker).

Everything here is the library's: `diagnose` and `diagnosis_text` (what `ckpt-repair doctor` prints),
`inspect_checkpoint` (what `inspect` shows), `repair.plan` (what `fix --dry-run` plans).
"""

from __future__ import annotations

from repair import api
from repair.doctor.diagnose import diagnose
from repair.doctor.findings import Severity
from repair.doctor.inspection import Inspection, inspect_checkpoint
from repair.doctor.text import diagnosis_json, diagnosis_text
from repair.errors import RepairError
from repair.hub.source import open_source
from repair.io.dtypes import nbytes
from repair.planning.model import Plan, ShardOp
from repair.planning.text import plan_as_text
from repair.targets.profiles import resolve
from repair.web.choices import recipe_for


MAX_ROWS = 2000  # a DeepSeek-sized model has ~60k linear modules: the page shows the first ones, `inspect` lists all
MAX_FINDINGS = 200


def analyze(request: dict) -> dict:
    """{verdict, doctor_text, exit_code, stops, findings, modules, plan_text, plan_error, bytes} for one source."""
    ckpt = open_source(request["source"])
    target, tp = resolve(request.get("target")), int(request.get("tp") or 1)
    result = diagnose(ckpt, target, tp)
    seen = inspect_checkpoint(ckpt)
    answer = {
        "source": str(ckpt.root),
        "doctor_text": diagnosis_text(result, source=str(request["source"])),  # its suggested command names what was asked for, as the CLI's
        "exit_code": result.exit_code(),
        "stops": diagnosis_json(result)["runtime_stops_at"],
        "findings": {str(s): _first([f"[{f.code}] {f.message}" for f in result.findings if f.severity is s]) for s in Severity},
        "modules": module_rows(seen, result.runtime_precision),
        "plan_text": None, "plan_error": None, "noop": False, "bytes": None,
        "quantized": bool(seen.declaration.quant_algo) or any(v.module.is_quantized for v in seen.modules),
    }
    try:
        plan = api.plan(ckpt, recipe_for(request.get("recipe"), request.get("target")))
    except RepairError as err:
        answer["plan_error"] = str(err)
        return answer
    answer.update(plan_text=plan_as_text(plan), noop=plan.is_noop, bytes=transfer_bytes(plan))
    return answer


def module_rows(seen: Inspection, schemes: dict[str, str]) -> list[list[str]]:
    """One row per linear module: name, stored precision, stored vs expected shape, declared, scheme built."""
    rows = []
    for v in seen.modules:
        if not v.module.tensor("weight") or len(v.module.logical_shape) != 2:
            continue
        expected = list(v.expected_shape) if v.expected_shape is not None else None
        shape_ok = expected is None or tuple(expected) == v.module.logical_shape
        rows.append([v.module.name, v.module.precision, _shape(v.module.logical_shape),
                     _shape(expected) if expected else "?", v.declared, v.algorithm or "-",
                     schemes.get(v.module.name, "-"), "" if shape_ok else "shape mismatch"])
    if len(rows) > MAX_ROWS:
        rows = rows[:MAX_ROWS] + [[f"... and {len(rows) - MAX_ROWS:,} more modules: `ckpt-repair inspect` lists every one", *[""] * 7]]
    return rows


def _first(items: list[str]) -> list[str]:
    return items if len(items) <= MAX_FINDINGS else items[:MAX_FINDINGS] + [f"... and {len(items) - MAX_FINDINGS:,} more: doctor's text above counts them all"]


def transfer_bytes(plan: Plan) -> dict:
    """What a Hub fix of this plan moves: the source shards the rewrites read (downloaded whole) and the
    tensor bytes of the rewritten shards (uploaded); every other shard stays on the Hub."""
    located = plan.source.locate()
    sizes = {s.path.name: s.size for s in plan.source.shards}
    rewrites = [s for s in plan.shards if s.op == ShardOp.REWRITE]
    read = {s.name for s in rewrites if s.name in sizes}
    for step in rewrites:
        read |= {located[i][0].path.name for t in step.tensors if t.source == "checkpoint" for i in t.inputs if i in located}
    upload = sum(nbytes(t.out.dtype, t.out.shape) for s in rewrites for t in s.tensors)
    return {"download": sum(sizes[n] for n in read), "download_files": sorted(read), "upload": upload,
            "upload_files": [s.name for s in rewrites] + list(plan.json_files)}


def _shape(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
