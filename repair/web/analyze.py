"""The page's first answer for a source: doctor's verdict (its exact text), the module table, the
findings by severity and the plan with the bytes it moves. Runs in a worker process (repair.web.worker).

Everything here is the library's: `diagnose` and `diagnosis_text` (what `ckpt-repair doctor` prints),
`inspect_checkpoint` (what `inspect` shows), `repair.plan` (what `fix --dry-run` plans).
"""

from __future__ import annotations

from repair import api
from repair.doctor.diagnose import diagnose
from repair.doctor.findings import Diagnosis, Severity
from repair.doctor.inspection import Inspection, inspect_checkpoint
from repair.doctor.side_by_side import verdicts_text, worst_exit_code
from repair.doctor.text import diagnosis_json
from repair.errors import RepairError
from repair.hub.source import open_source
from repair.io.dtypes import nbytes
from repair.planning.model import Plan, ShardOp
from repair.planning.text import plan_as_text
from repair.targets.profiles import resolve_many, specs_text
from repair.web.choices import recipe_for
from repair.web.render import HEADERS


MAX_ROWS = 2000  # a DeepSeek-sized model has ~60k linear modules: the page shows the first ones, `inspect` lists all
MAX_FINDINGS = 200
NOTE = "note"  # the findings panel's heading for doctor's notes


def analyze(request: dict) -> dict:
    """{doctor_text, exit_code, verdicts, findings, modules, plan_text, plan_error, bytes, ...} for one source and one
    or several targets (`a,b` as the CLI's --target): doctor's text is the CLI's, side by side for several."""
    ckpt = open_source(request["source"])
    targets, tp = resolve_many(request.get("target")), int(request.get("tp") or 1)
    found = tuple(diagnose(ckpt, t, tp) for t in targets)
    reading = next((t for t in targets if t.profile.allows_quant_config), None)  # bf16 reads no quantization config
    seen = inspect_checkpoint(ckpt, reading)  # `declared`: the config as the first such target's class reads it
    answer = {
        "source": str(ckpt.root),
        "doctor_text": verdicts_text(found, source=str(request["source"])),  # its suggested command names what was asked for, as the CLI's
        "target": specs_text(targets),  # the --target value that makes the same fix (each part as resolved)
        "exit_code": worst_exit_code(found),
        "verdicts": [verdict_of(d) for d in found],
        "findings": findings_by_severity(found),
        "modules": module_rows(seen, {d.target.spec: d.runtime_precision for d in found}),
        "plan_text": None, "plan_error": None, "noop": False, "bytes": None,
        "quantized": bool(seen.declaration.quant_algo) or any(v.module.is_quantized for v in seen.modules),
    }
    try:
        recipe = recipe_for(request.get("recipe"), specs_text(targets))
        plan = api.plan(ckpt, recipe, before=found if tp == 1 and recipe.target == specs_text(targets) else None)
    except RepairError as err:
        answer["plan_error"] = str(err)
        return answer
    answer.update(plan_text=plan_as_text(plan), noop=plan.is_noop, bytes=transfer_bytes(plan))
    return answer


def verdict_of(d: Diagnosis) -> dict:
    """One target's verdict: where each rank stops (the runtime's own error), else its counts of errors, warnings and
    notes (a note can say a release past the profiles may refuse what doctor passes)."""
    return {"target": d.target.spec, "label": d.target.label, "exit_code": d.exit_code(),
            "stops": diagnosis_json(d)["runtime_stops_at"], "notes": len(d.notes),
            **{f"{s}s": sum(f.severity is s for f in d.findings) for s in (Severity.ERROR, Severity.WARNING)}}


def findings_by_severity(found: tuple[Diagnosis, ...]) -> dict[str, list[str]]:
    """Each finding once, under its severity, then doctor's notes (a target loads it, but worth knowing: a release past
    every profile whose newest one fails to load it) under "note". With several targets, one every target shares is
    said once (its target's name put as "each target", as doctor's side-by-side text does); any other is led by the
    targets it is for, and said in their shared words when there are several (never in the first one's:
    'sglang==0.5.23: vllm==... loads it')."""
    where: dict[str, dict[str, tuple[str, dict]]] = {str(s): {} for s in (*Severity, NOTE)}
    for d in found:
        for heading, f in [(str(f.severity), f) for f in d.findings] + [(NOTE, f) for f in d.notes]:
            text = f"[{f.code}] {f.message}"
            where[heading].setdefault(text.replace(d.target.spec, "each target"), (text, {}))[1][d.target.spec] = None
    def said(shared: str, own: str, specs: dict) -> str:  # specs: a dict as an ordered set (a target saying it twice counts once)
        return own if len(found) == 1 else shared if len(specs) == len(found) else f"{', '.join(specs)}: {own if len(specs) == 1 else shared}"
    return {str(s): _first([said(shared, *item) for shared, item in items.items()]) for s, items in where.items()}


def module_rows(seen: Inspection, schemes: dict[str, dict[str, str]]) -> dict:
    """One row per linear module: name, stored precision, stored vs expected shape, declared, the scheme each target
    builds; {headers, data} (a column per target)."""
    rows = []
    for v in seen.modules:
        if not v.module.tensor("weight") or len(v.module.logical_shape) != 2:
            continue
        expected = list(v.expected_shape) if v.expected_shape is not None else None
        shape_ok = expected is None or tuple(expected) == v.module.logical_shape
        rows.append([v.module.name, v.module.precision, _shape(v.module.logical_shape),
                     _shape(expected) if expected else "?", v.declared, v.algorithm or "-",
                     *[built.get(v.module.name, "-") for built in schemes.values()], "" if shape_ok else "shape mismatch"])
    width = 7 + len(schemes)
    if len(rows) > MAX_ROWS:
        rows = rows[:MAX_ROWS] + [[f"... and {len(rows) - MAX_ROWS:,} more modules: `ckpt-repair inspect` lists every one", *[""] * (width - 1)]]
    built_as = ["built as"] if len(schemes) == 1 else [f"built as ({spec})" for spec in schemes]
    return {"headers": [*HEADERS[:6], *built_as, HEADERS[-1]], "data": rows}


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
