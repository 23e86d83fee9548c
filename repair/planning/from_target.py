"""`fix --target T`: the smallest recipe after which `doctor --target T --strict` is clean.

For `bf16`, and for runtimes that build every drafter linear in BF16 (vLLM 0.21-0.24, on an
architecture with a loader profile), that is dequantizing every packed module and dropping the
quantization config. For runtimes that follow the checkpoint's own config (vLLM >= 0.25) it is
the handshake repair plus whatever the config contradicts: packed modules it excludes are
dequantized, BF16 modules it declares quantized are excluded, leftover scales of BF16 modules are
dropped. Without a loader profile nothing is simulated, so the plan is exactly what doctor's
checks contradict: on a checkpoint they find clean it changes nothing.
"""

from __future__ import annotations

from repair import arch, formats
from repair.doctor.findings import Diagnosis, Kind
from repair.arch.base import Architecture
from repair.formats.modules import FULL_PRECISIONS, StoredModule
from repair.io.checkpoint import Checkpoint
from repair.planning.built import built_family
from repair.planning.recipe import Recipe
from repair.planning.whole_layers import Layers, complete
from repair.targets.layer_names import release_names
from repair.targets.precision import runtime_precision
from repair.targets.profiles import specs_text

# config vs storage, a scheme the runtime cannot build, or a layer a runtime loads silently wrong (zero-padded, cast)
# or drops tensors of: dequantizing makes it BF16 and excluded, and writes no scales
FIXED_BY_DEQUANTIZING = (Kind.CONFIG_CONTRADICTION, Kind.LOAD_ERROR, Kind.RUNTIME_SCHEME, Kind.SILENT_GARBAGE, Kind.IGNORED_TENSORS)
# the stored tensors show another algorithm than the one declared (or lack the activation scale it needs): the
# dequantizer reads what is stored (NVFP4, W4A16_NVFP4, NVFP4_AWQ with its scale folded, FP8), so BF16 settles it
STORED_ALGORITHM = (Kind.ALGORITHM_MISMATCH, Kind.MISSING_INPUT_SCALE)


def recipe_for_targets(ckpt: Checkpoint, before: tuple[Diagnosis, ...], dropped: frozenset[str] = frozenset()) -> Recipe:
    """`--target a,b,c`: the union of each target's derived recipe (doctor's verdict on the input for each, in
    `before`). Every derived change makes a module BF16 and excluded, or drops the quantization config, and no
    target's loader fails on a module the checkpoint's own config excludes, so the union leaves every target clean;
    the plan check and the writer's doctor check that on the plan and the output, target by target. `dropped`: the
    modules the user's own rules drop."""
    recipes = [recipe_for_target(ckpt, d, dropped) for d in before]
    dequantize = tuple(dict.fromkeys(n for r in recipes for n in r.dequantize))
    return Recipe(dequantize=dequantize, drop_quantization=any(r.drop_quantization for r in recipes),
                  from_target=specs_text(tuple(d.target for d in before)))


def recipe_for_target(ckpt: Checkpoint, diagnosis: Diagnosis, dropped: frozenset[str] = frozenset()) -> Recipe:
    """The smallest recipe for diagnosis.target, from doctor's verdict on the input (`diagnosis`), beside the user's
    drops (`dropped`)."""
    target = diagnosis.target
    fmt = formats.detect(ckpt)
    stored = fmt.group_modules(ckpt.infos())
    modules = [m for m in stored if m.tensor("weight")]
    family = built_family(ckpt, diagnosis)  # the class the target's release builds (doctor's decision)
    specs = arch.expected_modules(ckpt.config, str(ckpt.root / "config.json"), family) or {}
    if not target.profile.allows_quant_config or (target.wants_all_bf16 and specs):
        return Recipe(dequantize=tuple(m.name for m in modules if m.is_quantized), drop_quantization=True, from_target=target.spec)
    layers = Layers({m.name: m for m in stored}, family.one_parameter_layers, release_names(target, ckpt.config))
    names = {m.name for m in modules} | excludable_leafless(stored, family)
    if not specs:
        chosen = _contradicted(diagnosis, names, family.one_parameter_layers, dropped=dropped)
        return Recipe(dequantize=complete(_nameable(chosen, family), layers, f"{ckpt.root}: {target.spec}"), from_target=target.spec)
    precision = runtime_precision(specs, fmt.read_declaration(ckpt), target, family)
    chosen = list(_contradicted(diagnosis, names, {}, STORED_ALGORITHM))
    for m in modules:
        spec = specs.get(m.name)
        linear = spec is not None and spec.is_linear and spec.role != "embed"
        built = precision.get(m.name, "bf16")
        if m.name in chosen:
            continue
        if m.name in family.bf16_handshake and m.name in specs:
            chosen.append(m.name)
        elif m.is_quantized and built == "bf16":
            chosen.append(m.name)
        elif not m.is_quantized and linear and (built == "nvfp4" or len(m.tensors) > 1):
            chosen.append(m.name)
    return Recipe(dequantize=complete(_nameable(tuple(chosen), family), layers, f"{ckpt.root}: {target.spec}"), from_target=target.spec)


def excludable_leafless(stored: list[StoredModule], family: Architecture) -> set[str]:
    """Full-precision tensors stored with no `.weight` leaf (transformers' fused 3-D experts, `...experts.gate_up_proj`)
    that load into a layer the runtime builds under another prefix (the profile's `prefixes`: FusedMoE's `...experts`):
    an exclusion of that prefix is their repair, as a config edit (the tensors are copied as they are)."""
    return {m.name for m in stored if m.tensor("weight") is None and m.precision in FULL_PRECISIONS
            and family.exclusion_name(m.name) not in ("", m.name)}


def _nameable(chosen: tuple[str, ...], family: Architecture) -> tuple[str, ...]:
    """The chosen modules an exclusion entry can reach: a layer the runtime builds under the prefix "" (vLLM 0.32's
    Afmoe lm_head) is built quantized whatever the config says, so making it BF16 cannot help; the plan check then
    refuses its finding in one line (planning/target_check.py)."""
    return tuple(n for n in chosen if family.runtime_name(n) != "")


def _contradicted(diagnosis: Diagnosis, names: set[str], fused: dict[str, tuple[str, ...]],
                  kinds: tuple[Kind, ...] = FIXED_BY_DEQUANTIZING + STORED_ALGORITHM, dropped: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """Modules doctor finds stored against the config (no loader profile: its checks are the whole truth we have).
    Dequantizing one makes it BF16 and excluded, which settles either side of the disagreement. A fused layer whose
    shards disagree (its subject is the runtime name, e.g. `...qkv_proj`) is settled by dequantizing its shards, unless
    the user drops one of them (Qwen4Exp's indexer projection, which its build without QSA has no parameter for): the
    shards left are another layer, which the writer's doctor check judges on the output."""
    findings = diagnosis.findings
    chosen = {f.subject for f in findings if f.code in kinds and f.subject in names}
    for f in findings:
        parent, _, layer = f.subject.rpartition(".")
        shards = [f"{parent}.{shard}" for shard in fused.get(layer, ())]
        if f.code == Kind.FUSED_SHARDS and layer in fused and not dropped.intersection(shards):
            chosen.update(n for n in shards if n in names)
    return tuple(sorted(chosen))
