"""Recipe + Checkpoint (+ original) -> Plan: a pure value saying, per output file and tensor, what to do.

Planning reads headers and small JSON files only. A plan can be printed (`--dry-run`) and is
checked completely before the executor writes a byte.
"""

from __future__ import annotations

from repair import formats
from repair.doctor.declared import KV_LEAVES
from repair.doctor.diagnose import Diagnosis, diagnose_each
from repair.errors import BadInput, UsageError
from repair.formats.base import Format
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, Checkpoint
from repair.io.dtypes import nbytes
from repair.io.names import path_text
from repair.io.output import REPORT_NAME
from repair.io.safetensors import ShardHeader
from repair.formats.modules import StoredModule
from repair.planning import check as plan_check
from repair.planning.built import built_families
from repair.planning.model import ChangeAction, Copy, ModuleChange, Plan, ShardOp, ShardStep, TensorRef, TensorStep
from repair.planning.modules import module_change, requantized_group
from repair.planning.recipe import ACTIONS, DEFAULT, Action, ModuleMatcher, Recipe
from repair.planning.config_edits import config_edits, unlisted_layers
from repair.planning.target_check import refuse_empty_plan, refuse_unrepairable, unused_exclusions
from repair.planning.whole_layers import Layers, refuse_split_layers
from repair.targets.profiles import resolve_many

__all__ = ["assign_actions", "kv_scale_drops", "make_plan", "select"]


def select(modules: list[StoredModule], matcher: ModuleMatcher) -> list[StoredModule]:
    """Modules whose name matches any of the matcher's patterns: exact, a glob, or `re:REGEX` (full match)."""
    return [m for m in modules if matcher.matches(m.name)]


def assign_actions(modules: list[StoredModule], recipe: Recipe, where: str) -> dict[str, Action]:
    """Module name -> action; the first action in ACTIONS order wins where patterns overlap. A target's derived recipe
    names, by its exact name, a full-precision tensor stored with no `.weight` leaf (3-D experts) too: its repair is an
    exclusion (planning/from_target.py); a user's pattern never reaches such tensors (norms, biases)."""
    weighted = [m for m in modules if m.tensor("weight") or (recipe.from_target and m.name in recipe.dequantize)]
    actions: dict[str, Action] = {}
    for action in ACTIONS:
        patterns = recipe.patterns(action)
        hits = select(weighted, recipe.matcher(patterns, f"{where}: {action} module pattern")) if patterns else []
        derived = recipe.from_target and action in (Action.DEQUANTIZE, Action.TAKE_ORIGINAL)  # a target adds only these (may match nothing)
        if patterns and not hits and not derived and action != Action.KEEP:
            if recipe == DEFAULT:
                raise UsageError(_not_the_default_model(where, modules))
            raise UsageError(f"{where}: no module matches {', '.join(patterns)} ({action}); run `ckpt-repair inspect` to see the module names")
        for m in hits + _by_algorithm(weighted, recipe, action, where):
            actions.setdefault(m.name, action)
    return {name: a for name, a in actions.items() if a != Action.KEEP}


def _by_algorithm(weighted: list[StoredModule], recipe: Recipe, action: Action, where: str) -> list[StoredModule]:
    """The modules the recipe's algorithm rules for `action` select: pattern and stored algorithm both match."""
    hits = []
    for rule in recipe.algorithm_rules(action):
        found = select([m for m in weighted if m.algorithm in rule.algorithms], recipe.matcher(rule.modules, f"{where}: {action} module pattern"))
        if not found and action != Action.KEEP:
            raise UsageError(f"{where}: no module stored as {' or '.join(rule.algorithms)} matches {', '.join(rule.modules)} ({action}); "
                             "run `ckpt-repair inspect` to see the modules and their algorithms")
        hits += found
    return hits


def _not_the_default_model(where: str, modules: list[StoredModule]) -> str:
    """The default recipe is the Gemma 4 assistant's; on any other checkpoint, say so and what to use instead."""
    quantized = any(m.is_quantized for m in modules)
    instead = "--target vllm==X.Y.Z or --target bf16, or --recipe modelopt-dequantize-mlp" if quantized else "--target or --recipe"
    return (f"{where}: no recipe given, and the default repair is the Gemma 4 assistant's handshake fix (dequantize "
            f"{', '.join(DEFAULT.dequantize)}), which this checkpoint does not have; use {instead} (see `ckpt-repair recipes`)")


def make_plan(ckpt: Checkpoint, recipe: Recipe, original: Checkpoint | None = None, before: tuple[Diagnosis, ...] | None = None) -> Plan:
    """Plan the repair of `ckpt` by `recipe` without reading any tensor data. `before`: doctor's verdict on `ckpt` for
    each of the recipe's targets, where the caller has it (else asked here); the plan carries it to the report."""
    refuse_rank_files(ckpt)
    if before is None:
        before = diagnose_each(ckpt, resolve_many(recipe.from_target)) if recipe.from_target else ()
    fmt = formats.detect(ckpt)
    modules = fmt.group_modules(ckpt.infos())
    by_name = {m.name: m for m in modules}
    declaration = fmt.read_declaration(ckpt)
    declared = declaration.quant_algo if declaration.layer_algos is None else None
    actions = _with_fused_siblings(assign_actions(modules, recipe, str(ckpt.root)), by_name, declared)
    if declaration.quantized and not recipe.drop_quantization:  # the output is built by a quantization config
        for family in built_families(ckpt, before):  # each target's layers: the class its release builds
            refuse_split_layers(actions, Layers(by_name, family.one_parameter_layers), str(ckpt.root))
    _check_supported(ckpt, fmt, actions, original, recipe, by_name)
    refuse_unrepairable(ckpt, recipe, declaration, actions, before)
    changes = [c for name, a in sorted(actions.items()) if (c := module_change(by_name[name], a, ckpt, original, recipe, by_name, fmt, declared))]
    undeclared_kv = recipe.from_target is not None and declaration.kv_cache is None  # doctor: the runtime ignores or refuses them
    changes += kv_scale_drops(ckpt, changes) if recipe.drop_quantization or undeclared_kv else []
    shards, emptied = _shard_steps(ckpt, changes)
    config, hf_quant, added = config_edits(ckpt, fmt, declaration, recipe, actions, by_name, before)
    unused = unused_exclusions(ckpt, recipe, before, by_name, fmt, frozenset(n for n, a in actions.items() if a == Action.DROP))
    if unused:
        config, hf_quant = fmt.without_entries(config, hf_quant, unused)
    json_files = _json_files(ckpt, config, hf_quant, shards, bool(emptied))
    removed = emptied + ((HF_QUANT_CONFIG,) if recipe.drop_quantization and ckpt.hf_quant_config is not None else ())
    copied = _other_files(ckpt) + tuple(n for n in _small_files(ckpt) if n not in json_files and n not in removed)
    plan = Plan(ckpt, recipe, shards, tuple(changes), added, json_files, copied, removed, original, fmt,
                unlisted_layers(declaration, config, hf_quant), tuple(sorted(unused)), before)
    refuse_empty_plan(ckpt, recipe, plan.is_noop, before)
    plan_check.check_plan(plan)  # looked up on the module: tests switch it off to reach the writer's own checks
    return plan


def refuse_rank_files(ckpt: Checkpoint) -> None:
    """A rank folder of an earlier `fix --tp` output holds slices under the whole model's config: repaired as it is or
    split again, it makes a layout no runtime loads. Known by the metadata our rank files carry (decimal `tp_rank`
    and `tp_size`)."""
    for shard in ckpt.shards:
        rank, size = ((shard.metadata or {}).get(k) for k in ("tp_rank", "tp_size"))
        if all(isinstance(v, str) and v.isdecimal() and len(v) <= 9 for v in (rank, size)):
            raise UsageError(f"{path_text(shard.path)}: a per-rank file an earlier `fix --tp` wrote (rank {rank} of {size}); run "
                             "`ckpt-repair unshard` on the folder that holds its tp_manifest.json, then fix the checkpoint it rebuilds")


def _check_supported(ckpt: Checkpoint, fmt: Format, actions: dict[str, Action], original: Checkpoint | None, recipe: Recipe,
                     modules: dict[str, StoredModule]) -> None:
    """Refuse, before anything is read, what the recipe needs but the source's format cannot do."""
    needs_original = any(a in (Action.TAKE_ORIGINAL, Action.REQUANTIZE) for a in actions.values())
    if original is None and needs_original:
        raise UsageError(f"{ckpt.root}: the recipe takes or requantizes modules from the original model; pass --original ORIG")
    left = [m.name for m in modules.values() if m.is_quantized and actions.get(m.name) not in (Action.DEQUANTIZE, Action.TAKE_ORIGINAL, Action.DROP)]
    if recipe.drop_quantization and left:
        raise UsageError(f"{ckpt.root}: the recipe drops the quantization config but leaves {len(left)} module(s) packed ({left[0]}, ...), "
                         "which would then load as garbage or not at all; use a recipe for this model (see `ckpt-repair recipes`) or --target")
    _refuse_unscaled_float8(ckpt, actions, recipe, modules)
    for operation, used in (("requantize", Action.REQUANTIZE in actions.values()), ("original", original is not None)):
        reason = fmt.unsupported(operation) if used else None
        if reason:
            raise UsageError(f"{ckpt.root}: {reason}")


def _refuse_unscaled_float8(ckpt: Checkpoint, actions: dict[str, Action], recipe: Recipe, modules: dict[str, StoredModule]) -> None:
    """A float8 weight without its float32 per-tensor weight_scale has no readable values: dequantizing it, or keeping
    it in an output that declares no quantization (or excludes it), would write its raw codes as weights."""
    for m in modules.values():
        action = actions.get(m.name)
        if not m.precision.startswith("f8_") or action in (Action.TAKE_ORIGINAL, Action.REQUANTIZE, Action.DROP):
            continue
        if action == Action.DEQUANTIZE or recipe.drop_quantization:
            raise BadInput(f"{ckpt.root}: {m.tensor('weight')} is {m.precision} without a float32 per-tensor weight_scale, so its "
                           "values cannot be read; restore the export's weight_scale, or take the module from the original model "
                           "(--original with a take_original rule)")


def kv_scale_drops(ckpt: Checkpoint, changes: list[ModuleChange]) -> list[ModuleChange]:
    """Dropping the quantization config drops its KV-cache declaration (kv_cache_quant_algo, kv_cache_scheme), so
    the KV-cache scales go too: a BF16 checkpoint holding k_scale / v_scale is one the runtime ignores or refuses."""
    taken = {t.name for c in changes for t in c.before}
    infos = ckpt.infos()
    return [ModuleChange(name, ChangeAction.DROP_KV_CACHE_SCALE, (TensorRef(name, info.dtype, info.shape),), (), (), info.path.name)
            for name, info in sorted(infos.items()) if name.rpartition(".")[2] in KV_LEAVES and name not in taken]


def _with_fused_siblings(actions: dict[str, Action], modules: dict[str, StoredModule], declared: str | None) -> dict[str, Action]:
    """Requantizing one member of a group that shares one global scale requantizes the group (`declared`: the
    checkpoint's single quant_algo, which decides how a BF16 module is packed)."""
    out = dict(actions)
    for name, action in actions.items():
        if action == Action.REQUANTIZE:
            out.update({sibling: Action.REQUANTIZE for sibling in requantized_group(modules[name], modules, declared)})
    return out


def _shard_steps(ckpt: Checkpoint, changes: list[ModuleChange]) -> tuple[tuple[ShardStep, ...], tuple[str, ...]]:
    """Every output shard's step, and the shards that lose all of their tensors (not written)."""
    owner = {t.name: c for c in changes for t in c.before}
    steps, emptied = [], []
    for shard in ckpt.shards:
        step = _shard_step(shard, owner)
        if shard.tensors and not step.tensors:
            emptied.append(step.name)
        else:
            steps.append(step)
    if ckpt.shards and not steps:
        raise UsageError(f"{ckpt.root}: the recipe drops every tensor, so the output would hold no weights; keep at least one module")
    return tuple(steps), tuple(emptied)


def _shard_step(shard: ShardHeader, owner: dict[str, ModuleChange]) -> ShardStep:
    """Copy the shard whole, or rewrite it: a changed module's outputs take the place of its first
    tensor in its home shard; other shards just lose the module's tensors."""
    name = shard.path.name
    if not any(t.name in owner for t in shard.tensors):
        steps = tuple(Copy(TensorRef(t.name, t.dtype, t.shape), (t.name,)) for t in shard.tensors)
        return ShardStep(name, ShardOp.COPY_FILE, steps, shard.metadata)
    steps: list[TensorStep] = []
    emitted: set[str] = set()
    for t in shard.tensors:
        change = owner.get(t.name)
        if change is None:
            steps.append(Copy(TensorRef(t.name, t.dtype, t.shape), (t.name,)))
        elif change.home == name and change.module not in emitted:
            emitted.add(change.module)
            steps.extend(change.outputs)
    return ShardStep(name, ShardOp.REWRITE, tuple(steps), shard.metadata)


def _json_files(ckpt: Checkpoint, config, hf_quant, shards: tuple[ShardStep, ...], shards_removed: bool) -> dict[str, dict]:
    """The small JSON files whose content changes; the others are copied byte for byte."""
    candidates = {CONFIG: (ckpt.config, config), HF_QUANT_CONFIG: (ckpt.hf_quant_config, hf_quant)}
    if ckpt.index is not None and (shards_removed or any(s.op == ShardOp.REWRITE for s in shards)):
        candidates[ckpt.index_name] = (ckpt.index, _index(ckpt.index, shards))
    return {name: new for name, (old, new) in candidates.items() if new is not None and new != old}


def _other_files(ckpt: Checkpoint) -> tuple[str, ...]:
    """Files copied through unchanged; an earlier run's repair_report.json is not one (it describes that run, and this
    run writes its own in its place)."""
    return tuple(n for n in ckpt.other_files if n != REPORT_NAME)


def _small_files(ckpt: Checkpoint) -> list[str]:
    present = [(CONFIG, ckpt.config), (HF_QUANT_CONFIG, ckpt.hf_quant_config), (ckpt.index_name, ckpt.index)]
    return [name for name, content in present if content is not None]


def _index(old: dict, shards: tuple[ShardStep, ...]) -> dict:
    """The source index with the weight map and total size recomputed from the planned shards."""
    weight_map = {t.out.name: s.name for s in shards for t in s.tensors}
    total = sum(nbytes(t.out.dtype, t.out.shape) for s in shards for t in s.tensors)
    metadata = dict(old.get("metadata") or {})
    metadata["total_size"] = total
    new = {k: v for k, v in old.items() if k not in ("metadata", "weight_map")}
    return {"metadata": metadata, **new, "weight_map": dict(sorted(weight_map.items()))}
