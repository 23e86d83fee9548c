"""A plan as text for people and as JSON for programs (used by --dry-run and the report)."""

from __future__ import annotations

from repair.plan import Plan


def plan_as_json(plan: Plan) -> dict:
    return {
        "source": str(plan.source.root),
        "changes": [
            {"module": c.module, "action": c.action, "before": [t.as_dict() for t in c.before], "after": [t.as_dict() for t in c.after]}
            for c in plan.changes
        ],
        "exclusions_added": list(plan.exclusions_added),
        "files": [{"name": s.name, "op": s.op} for s in plan.shards]
        + [{"name": n, "op": "rewrite_json"} for n in plan.json_files]
        + [{"name": n, "op": "copy_file"} for n in plan.copied_files]
        + [{"name": n, "op": "remove"} for n in plan.removed_files],
    }


def plan_as_text(plan: Plan) -> str:
    lines = [f"plan for {plan.source.root}:"]
    for c in plan.changes:
        weight = c.after[0]
        stored = next(t for t in c.before if t.name == weight.name)
        dropped = [t.name.rsplit(".", 1)[1] for t in c.before if t.name != weight.name]
        what = f"dequantize nvfp4 {list(stored.shape)} -> {weight.dtype.lower()} {list(weight.shape)}" if c.action == "dequantize" else "keep weight"
        lines.append(f"  {c.module}: {what}" + (f"; drop {', '.join(dropped)}" if dropped else ""))
    if plan.recipe.drop_quantization:
        lines.append("  quantization config: removed (config.json quantization_config" + (", hf_quant_config.json)" if plan.removed_files else ")"))
    if plan.exclusions_added:
        lines.append(f"  exclusions: add {', '.join(plan.exclusions_added)} (config.json and hf_quant_config.json)")
    rewritten = [s.name for s in plan.shards if s.op == "rewrite"]
    copied = [s.name for s in plan.shards if s.op == "copy_file"] + list(plan.copied_files)
    lines.append(f"  files: {len(rewritten)} shard(s) rewritten, {len(plan.json_files)} config file(s) rewritten, {len(copied)} copied unchanged")
    return "\n".join(lines)
