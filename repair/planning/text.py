"""A plan as text for people and as JSON for programs (used by --dry-run and the report)."""

from __future__ import annotations

from repair.doctor.grouping import GROUP_FROM, first_text, names_text, pattern_text
from repair.errors import one_line
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG
from repair.planning.model import ChangeAction, ModuleChange, Plan, ShardOp

LONG_PLAN = 20  # more module lines than this are grouped (the 31B assistant's --target vllm==0.22.1 has 22)
SHARD_EMPTIED = "every tensor it held moved to another shard or was dropped"


def plan_as_json(plan: Plan) -> dict:
    return {
        "source": str(plan.source.root),
        "format": plan.format.NAME,
        "changes": [c.as_dict() for c in plan.changes],
        "exclusions_added": list(plan.exclusions_added),
        "exclusions_removed": list(plan.exclusions_removed),
        "quantized_layers_removed": list(plan.unlisted),
        "configs_aligned": configs_aligned(plan),
        "files": [{"name": s.name, "op": s.op} for s in plan.shards]
        + [{"name": n, "op": "rewrite_json"} for n in plan.json_files]
        + [{"name": n, "op": ShardOp.COPY_FILE} for n in plan.copied_files]
        + [{"name": n, "op": "remove", "why": _removed_why(plan, n)} for n in plan.removed_files],
    }


def _removed_why(plan: Plan, name: str) -> str:
    """A file is left out of OUT for one of two reasons: the quantization config goes, or a shard lost every tensor."""
    return "quantization config dropped" if name == HF_QUANT_CONFIG else SHARD_EMPTIED


def _removed_shards(plan: Plan) -> list[str]:
    return [n for n in plan.removed_files if n != HF_QUANT_CONFIG]


def _kv_text(plan: Plan, kv_scales: list[str]) -> str:
    dropped = f"{len(kv_scales)} k_scale / v_scale tensor(s) dropped ({kv_scales[0]}, ...)"
    if plan.format.read_declaration(plan.source).kv_cache is None:
        return f"KV-cache scales: {dropped}: no KV-cache quantization is declared, so the runtime would ignore or refuse them"
    return f"KV-cache quantization: removed with it: {dropped} and the KV-cache declaration (kv_cache_quant_algo / kv_cache_scheme)"


def plan_as_text(plan: Plan, verbose: bool = False) -> str:
    """The plan for people: one line per module, or (unless verbose) alike changes of many modules as one."""
    lines = [f"plan for {plan.source.root}:"]
    if plan.changes:
        lines.append(f"  {_recipe_label(plan)} changes {_counts(plan.changes)}")
    kv_scales = [c.module for c in plan.changes if c.action == ChangeAction.DROP_KV_CACHE_SCALE]
    lines += _change_lines([c for c in plan.changes if c.action != ChangeAction.DROP_KV_CACHE_SCALE], verbose)
    if plan.recipe.drop_quantization:
        lines.append("  quantization config: removed (config.json quantization_config" + (", hf_quant_config.json)" if HF_QUANT_CONFIG in plan.removed_files else ")"))
    if kv_scales:
        lines.append(f"  {_kv_text(plan, kv_scales)}")
    if plan.exclusions_added:
        files = " and ".join(n for n in (CONFIG, HF_QUANT_CONFIG) if n in plan.json_files)
        lines.append(f"  exclusions: add {names_text(plan.exclusions_added, verbose)} ({files})")
    if plan.exclusions_removed:
        files = " and ".join(n for n in (CONFIG, HF_QUANT_CONFIG) if n in plan.json_files)
        lines.append(f"  exclusions: remove {names_text(plan.exclusions_removed, verbose)}, which match no module ({files})")
    if plan.unlisted:
        lines.append(f"  quantized_layers: take out {names_text(plan.unlisted, verbose)} ({CONFIG} and {HF_QUANT_CONFIG}, and {CONFIG} config_groups)")
    if configs_aligned(plan):
        lines.append(f"  exclusions: {HF_QUANT_CONFIG} exclude_modules made equal to {CONFIG} ignore (they disagreed; vLLM reads {CONFIG})")
    rewritten = [s.name for s in plan.shards if s.op == ShardOp.REWRITE]
    copied = [s.name for s in plan.shards if s.op == ShardOp.COPY_FILE] + list(plan.copied_files)
    removed = _removed_shards(plan)
    lines.append(f"  files: {len(rewritten)} shard(s) rewritten, {len(plan.json_files)} config file(s) rewritten, {len(copied)} copied unchanged"
                 + (f", {len(removed)} shard(s) not written ({', '.join(removed)}: {SHARD_EMPTIED})" if removed else ""))
    return "\n".join(lines + [f"  {w}" for w in plan_warnings(plan)])


def plan_warnings(plan: Plan) -> list[str]:
    """What the user should know even under --quiet: files copied without being checked."""
    nested = [n for n in plan.copied_files if n.endswith(".safetensors")]
    return [f"copied byte for byte, not checked or repaired (only top-level shards are the checkpoint): {', '.join(nested)}"] if nested else []


def _change_lines(changes: list[ModuleChange], verbose: bool) -> list[str]:
    """`module: what happens`, in the plan's order; in a long plan, GROUP_FROM or more modules with the same change are one line."""
    verbose = verbose or len(changes) <= LONG_PLAN
    alike: dict[str, list[str]] = {}
    for c in changes:
        alike.setdefault(_change_text(c), []).append(c.module)
    lines = []
    for text, modules in alike.items():
        if verbose or len(modules) < GROUP_FROM:
            lines += [f"  {m}: {text}" for m in modules]
        else:
            lines += [f"  {len(modules)} alike: {pattern_text(modules)}: {text}", f"    {first_text(modules)}"]
    return [one_line(line) for line in lines]  # module names come from the checkpoint: no forged lines


def _recipe_label(plan: Plan) -> str:
    recipe = plan.recipe
    if recipe.from_target:
        return f"--target {recipe.from_target}" + (f" (with recipe {recipe.name})" if recipe.name != "default" else "")
    return f"recipe {recipe.name}"


def _counts(changes: tuple[ModuleChange, ...]) -> str:
    """How many modules each action touches, e.g. "12 module(s): dequantize 10, drop-leftover-scales 2"."""
    counts: dict[str, int] = {}
    for c in changes:
        counts[c.action] = counts.get(c.action, 0) + 1
    return f"{len(changes)} module(s): " + ", ".join(f"{action} {n}" for action, n in counts.items())


def configs_aligned(plan: Plan) -> bool:
    """The two config files' exclusion lists disagreed on input and agree in the output."""
    fmt = plan.format
    src = plan.source
    before = fmt.exclusion_lists(src.config, src.hf_quant_config)
    after = fmt.exclusion_lists(plan.json_files.get(CONFIG, src.config), plan.json_files.get(HF_QUANT_CONFIG, src.hf_quant_config))
    return len(before) == 2 and set(before[0]) != set(before[1]) and len(after) == 2 and set(after[0]) == set(after[1])


def _change_text(c: ModuleChange) -> str:
    before = {t.name.rsplit(".", 1)[1]: t for t in c.before}
    after = {t.name.rsplit(".", 1)[1]: t for t in c.after}
    dropped = [leaf for leaf in before if leaf not in after]
    stored = c.before[0] if c.before else None  # a module's weight comes first, whatever its format calls it
    new = after.get("weight") or (c.after[0] if c.after else None)  # 3-D experts: the weight is the module's own name
    shape = lambda t: f"{'nvfp4' if t.dtype == 'U8' else t.dtype.lower()} {list(t.shape)}"  # noqa: E731
    what = {
        ChangeAction.DEQUANTIZE: lambda: f"dequantize {_algorithm(c)}{shape(stored)} -> {shape(new)}",
        ChangeAction.TAKE_ORIGINAL: lambda: f"take {shape(new)} from the original (was {shape(stored)})",
        ChangeAction.REQUANTIZE: lambda: f"requantize from the original -> {'fp8' if new.dtype == 'F8_E4M3' else 'nvfp4'} {list(new.shape)} (was {shape(stored)})",
        ChangeAction.DROP: lambda: "drop the module",
        ChangeAction.DROP_LEFTOVER_SCALES: lambda: "keep weight",
    }[c.action]()
    folded = " (pre_quant_scale folded into the weight)" if c.action == ChangeAction.DEQUANTIZE and _algorithm(c) == "NVFP4_AWQ " else ""
    return what + folded + (f"; drop {', '.join(dropped)}" if dropped and c.action != ChangeAction.DROP else "")


def _algorithm(c: ModuleChange) -> str:
    """The stored algorithm a dequantize reads, where it is not plain NVFP4 (e.g. "FP8 ", "NVFP4_AWQ ")."""
    return "" if c.algorithm in ("NVFP4", None) else f"{c.algorithm} "
