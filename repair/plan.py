"""Recipe + Checkpoint -> Plan: a pure value saying, per output file and tensor, what to do.

Planning reads headers and small JSON files only. A plan can be printed (`--dry-run`) and is
checked completely before the executor writes a byte.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field

from repair.errors import UsageError
from repair.formats import modelopt_nvfp4 as fmt
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, Checkpoint
from repair.io.dtypes import nbytes
from repair.io.safetensors import ShardHeader, TensorInfo
from repair.modules import StoredModule
from repair.targets.vllm_matching import draft_prefix, is_excluded


@dataclass(frozen=True)
class Recipe:
    """What to repair: module patterns to turn back into full precision (exact, glob, or `re:`)."""

    dequantize: tuple[str, ...] = ("pre_projection", "post_projection")
    dtype: str = "BF16"
    drop_quantization: bool = False  # write a plain checkpoint: no quantization_config, no hf_quant_config.json
    from_target: str | None = None  # set when the recipe was derived from `--target`


@dataclass(frozen=True)
class TensorRef:
    name: str
    dtype: str
    shape: tuple[int, ...]

    def as_dict(self) -> dict:
        return {"name": self.name, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class TensorStep:
    """How one output tensor is produced: `copy` its stored bytes, or `dequantize` a packed module."""

    out: TensorRef
    op: str
    inputs: tuple[str, ...]


@dataclass(frozen=True)
class ShardStep:
    """One output shard: copied whole when nothing in it changes, else rewritten tensor by tensor."""

    name: str
    op: str  # "copy_file" | "rewrite"
    tensors: tuple[TensorStep, ...]
    metadata: dict | None = field(default=None, compare=False)


@dataclass(frozen=True)
class ModuleChange:
    module: str
    action: str
    before: tuple[TensorRef, ...]
    after: tuple[TensorRef, ...]


@dataclass(frozen=True, eq=False)
class Plan:
    source: Checkpoint
    recipe: Recipe
    shards: tuple[ShardStep, ...]
    changes: tuple[ModuleChange, ...]
    exclusions_added: tuple[str, ...]
    json_files: dict[str, dict]  # rewritten small files: name -> new content
    copied_files: tuple[str, ...]
    removed_files: tuple[str, ...] = ()


    @property
    def is_noop(self) -> bool:
        return not self.changes and not self.json_files and not self.removed_files


def select(modules: list[StoredModule], patterns: tuple[str, ...]) -> list[StoredModule]:
    """Modules whose name matches any pattern: exact, a glob, or `re:REGEX` (full match)."""
    return [m for m in modules if any(_matches(m.name, p) for p in patterns)]


def _matches(name: str, pattern: str) -> bool:
    if pattern.startswith("re:"):
        return re.fullmatch(pattern[3:], name) is not None
    return name == pattern or fnmatch.fnmatchcase(name, pattern)


def make_plan(ckpt: Checkpoint, recipe: Recipe) -> Plan:
    """Plan the repair of `ckpt` by `recipe` without reading any tensor data."""
    infos = ckpt.infos()
    modules = fmt.group_modules(infos)
    declaration = fmt.read_declaration(ckpt)
    chosen = [m for m in select(modules, recipe.dequantize) if m.tensor("weight")]
    if not chosen and recipe.dequantize and not recipe.from_target:
        raise UsageError(f"{ckpt.root}: no module matches {', '.join(recipe.dequantize)}; run `ckpt-repair inspect` to see the module names")
    packed = [m for m in chosen if m.is_quantized]
    for module in packed:
        fmt.check_packed(module, infos, str(ckpt.root))
    leftovers = [m for m in chosen if not m.is_quantized and len(m.tensors) > 1]
    changes = tuple(_dequantize_change(m, infos, recipe.dtype) for m in packed) + tuple(_drop_change(m, infos) for m in leftovers)
    dropped = {name for m in packed + leftovers for name in m.tensors if name != m.tensor("weight")}
    shards = tuple(_shard_step(s, {m.tensor("weight"): m for m in packed}, dropped, recipe.dtype) for s in ckpt.shards)
    if recipe.drop_quantization:
        to_exclude: list[str] = []
        config, hf_quant = fmt.without_quantization(ckpt), None
    else:
        to_exclude = [m.name for m in chosen if declaration.quantized and not _covered(m.name, declaration)]
        config, hf_quant = fmt.with_exclusions(ckpt, [m.name for m in chosen] if declaration.quantized else [], _covers)
    json_files = _json_files(ckpt, config, hf_quant, shards)
    removed = (HF_QUANT_CONFIG,) if recipe.drop_quantization and ckpt.hf_quant_config is not None else ()
    copied = ckpt.other_files + tuple(n for n in _small_files(ckpt) if n not in json_files and n not in removed)
    return Plan(ckpt, recipe, shards, changes, tuple(to_exclude), json_files, copied, removed)


def _covers(exclusions: list[str], module: str) -> bool:
    return is_excluded(draft_prefix(module), exclusions)


def _covered(module: str, declaration: fmt.Declaration) -> bool:
    """Excluded in every config file present (so both runtimes' readers agree)."""
    lists = [x for x in (declaration.ignore, declaration.exclude_modules) if x is not None]
    return all(_covers(list(x), module) for x in lists)


def _drop_change(module: StoredModule, infos: dict[str, TensorInfo]) -> ModuleChange:
    before = tuple(TensorRef(n, infos[n].dtype, infos[n].shape) for n in module.tensors)
    weight = module.tensor("weight")
    return ModuleChange(module.name, "drop-leftover-scales", before, (TensorRef(weight, infos[weight].dtype, infos[weight].shape),))


def _dequantize_change(module: StoredModule, infos: dict[str, TensorInfo], dtype: str) -> ModuleChange:
    before = tuple(TensorRef(n, infos[n].dtype, infos[n].shape) for n in module.tensors)
    after = (TensorRef(module.tensor("weight"), dtype, module.logical_shape),)
    return ModuleChange(module.name, "dequantize", before, after)


def _shard_step(shard: ShardHeader, packed: dict[str, StoredModule], dropped: set[str], dtype: str) -> ShardStep:
    touched = any(t.name in packed or t.name in dropped for t in shard.tensors)
    if not touched:
        return ShardStep(shard.path.name, "copy_file", _copies(shard.tensors), shard.metadata)
    steps = []
    for t in shard.tensors:
        if t.name in dropped:
            continue
        module = packed.get(t.name)
        if module is None:
            steps.append(TensorStep(TensorRef(t.name, t.dtype, t.shape), "copy", (t.name,)))
        else:
            inputs = (module.tensor("weight"), module.tensor("weight_scale"), module.tensor("weight_scale_2"))
            steps.append(TensorStep(TensorRef(t.name, dtype, module.logical_shape), "dequantize", inputs))
    return ShardStep(shard.path.name, "rewrite", tuple(steps), shard.metadata)


def _copies(tensors: tuple[TensorInfo, ...]) -> tuple[TensorStep, ...]:
    return tuple(TensorStep(TensorRef(t.name, t.dtype, t.shape), "copy", (t.name,)) for t in tensors)


def _json_files(ckpt: Checkpoint, config, hf_quant, shards: tuple[ShardStep, ...]) -> dict[str, dict]:
    """The small JSON files whose content changes; the others are copied byte for byte."""
    candidates = {CONFIG: (ckpt.config, config), HF_QUANT_CONFIG: (ckpt.hf_quant_config, hf_quant)}
    if ckpt.index is not None and any(s.op == "rewrite" for s in shards):
        candidates[ckpt.index_name] = (ckpt.index, _index(ckpt.index, shards))
    return {name: new for name, (old, new) in candidates.items() if new is not None and new != old}


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
