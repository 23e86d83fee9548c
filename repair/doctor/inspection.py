"""What a checkpoint stores, module by module, from headers only (never imports torch)."""

from __future__ import annotations

from dataclasses import dataclass

from repair import arch
from repair import formats
from repair.arch import Architecture
from repair.formats.base import Declaration
from repair.io.checkpoint import Checkpoint
from repair.formats.modules import StoredModule, stored_bits
from repair.targets.layer_names import target_family
from repair.targets.precision import declared_algorithm
from repair.targets.profiles import NEWEST_KNOWN, Target, resolve


@dataclass(frozen=True)
class ModuleView:
    """One module as `inspect` shows it: stored vs expected, and what the config declares."""

    module: StoredModule
    expected_shape: tuple[int, ...] | None
    declared: str  # "quantized", "excluded", or "-" for non-linear tensors / unquantized checkpoints
    declared_algorithm: str | None = None  # the algorithm the config declares for it (vLLM 0.32's resolution), None: not quantized

    @property
    def algorithm(self) -> str | None:
        """The algorithm its stored tensors show."""
        return self.module.algorithm


@dataclass(frozen=True)
class Inspection:
    ckpt: Checkpoint
    declaration: Declaration
    modules: tuple[ModuleView, ...]
    bits_per_parameter: float
    target: str = NEWEST_KNOWN  # the release whose build `declared` describes
    architecture: str = ""  # the row of the class it builds for this config.json


def inspect_checkpoint(ckpt: Checkpoint, target: Target | None = None) -> Inspection:
    """`target`: the release whose build the declared column describes: the class its own registry resolves
    config.json's `architectures` to, and that class's row (default: the newest known vLLM release)."""
    infos = ckpt.infos()
    fmt = formats.detect(ckpt)
    modules = fmt.group_modules(infos)
    declaration = fmt.read_declaration(ckpt)
    target = target or resolve(None)
    family = target_family(target, ckpt.config)
    expected = arch.expected_modules(ckpt.config, str(ckpt.root / "config.json"), family) or {}
    read = target.bind(declaration, family, ckpt.config)  # with the target's own matching rules, as doctor reads it
    views = []
    for m in modules:
        declared = _declared(m, read, expected, family)
        algo = declared_algorithm(read, family, m.name) if declared == "quantized" else None
        views.append(ModuleView(m, expected[m.name].shape if m.name in expected else None, declared, algo))
    linears = [m for m in modules if m.tensor("weight")]
    return Inspection(ckpt, declaration, tuple(views), stored_bits(linears, infos), target.spec, family.name)


def _declared(module: StoredModule, declaration: Declaration, expected: dict, family: Architecture) -> str:
    """How the config declares a linear layer; "-" for everything quantization does not apply to."""
    spec = expected.get(module.name)
    linear = spec.is_linear if spec is not None else len(module.logical_shape) in (2, 3)  # 3-D: experts in one tensor
    if not module.tensor("weight") or not linear:
        return "-"
    return family.declared(module.name, declaration)


def as_json(result: Inspection) -> dict:
    d = result.declaration
    return {
        "source": str(result.ckpt.root),
        "shards": [s.path.name for s in result.ckpt.shards],
        "bytes": result.ckpt.total_bytes,
        "format": d.format.NAME,
        "declaration": {"quant_algo": d.quant_algo, "config_json_ignore": _list(d.ignore), "hf_quant_exclude_modules": _list(d.exclude_modules),
                        "kv_cache": d.kv_cache, "quantized_layers": d.layer_algos.as_dict() if d.layer_algos is not None else None,
                        # compressed-tensors groups of different schemes: (target, algorithm) in first-match order
                        "config_group_targets": [list(t) for t in d.group_algos.targets] if d.group_algos is not None else None},
        "bits_per_parameter": round(result.bits_per_parameter, 4),
        "target": result.target, "architecture": result.architecture,
        "modules": [
            {
                "name": v.module.name,
                "precision": v.module.precision,
                "stored_shape": list(v.module.stored_shape),
                "logical_shape": list(v.module.logical_shape),
                "expected_shape": list(v.expected_shape) if v.expected_shape is not None else None,
                "declared": v.declared,
                "algorithm": v.algorithm,
                "declared_algorithm": v.declared_algorithm,
                "tensors": list(v.module.tensors),
            }
            for v in result.modules
        ],
    }


def _list(values: tuple[str, ...] | None) -> list[str] | None:
    return list(values) if values is not None else None


def as_text(result: Inspection) -> str:
    d = result.declaration
    ckpt = result.ckpt
    lines = [
        f"{ckpt.root}: {len(ckpt.shards)} shard(s), {sum(len(s.tensors) for s in ckpt.shards)} tensors, {ckpt.total_bytes:,} bytes",
        f"format: {d.format.NAME}; declared: {d.quant_algo or 'no quantization'}; excluded: {', '.join(d.exclusions) or '-'}"
        + (f"; KV cache: {d.kv_cache}" if d.kv_cache else ""),
        f"{'module':<44} {'precision':<9} {'stored':<15} {'logical':<15} {'expected':<15} {'declared':<10} {'algorithm':<12} declared algorithm",
    ]
    for v in result.modules:
        if not v.module.tensor("weight") or len(v.module.logical_shape) not in (2, 3):  # 3-D: packed experts
            continue
        expected = _shape(v.expected_shape) if v.expected_shape is not None else "?"
        mark = "" if v.expected_shape in (None, v.module.logical_shape) else "  <- shape mismatch"
        lines.append(
            f"{v.module.name:<44} {v.module.precision:<9} {_shape(v.module.stored_shape):<15} "
            f"{_shape(v.module.logical_shape):<15} {expected:<15} {v.declared:<10} {v.algorithm or '-':<12} {v.declared_algorithm or '-'}{mark}"
        )
    lines.append(f"bits per parameter (linear and embedding weights, scales included): {result.bits_per_parameter:.3f}")
    lines.append(f"declared and expected as {result.target} builds it: {result.architecture}")
    return "\n".join(lines)


def _shape(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"
