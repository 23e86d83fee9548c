"""doctor's config and NVFP4-health checks (header and scale bytes only)."""

from __future__ import annotations

import re
from functools import partial

import numpy as np

from repair.arch import Architecture, ModuleSpec
from repair.codec import float_bits, fp8_block, scale_values
from repair.doctor.expert_scales import ExpertsRule, expert_scale_findings
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration
from repair.io.checkpoint import Checkpoint
from repair.formats.modules import StoredModule
from repair.formats.nvfp4_packed import block_scale_shape
from repair.formats.nvfp4_health import global_scale_problem, read_f32_scalar
from repair.doctor.scales import ScaleValues
from repair.doctor.unused_entries import unused_entries
from repair.arch.registry import Builds
from repair.targets.profiles import Target

FLOAT_BITS = {"F32": np.uint32, "BF16": np.uint16, "F16": np.uint16}  # a pre_quant_scale's dtypes, as bit patterns


def config_findings(ckpt: Checkpoint, declaration: Declaration, modules: dict[str, StoredModule], specs: dict[str, ModuleSpec],
                    family: Architecture, by_stored_name: bool = False,
                    target: Target | None = None, builds: Builds | None = None) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes): exclusions that match no module (a note where another shipped release reads the entry:
    doctor/unused_entries.py), the two config files disagreeing, and modules stored against their declaration.
    `by_stored_name`: the target's loader asks each module under its checkpoint name (TensorRT-LLM's module-driven one),
    not under the family's runtime names (vLLM's: the Gemma 4 assistant's `draft_model.` prefixes). `builds`: the
    class each release builds for config.json (read_builds), when read."""
    findings, notes = [], []
    for pattern, reader in unused_entries(ckpt, declaration, modules, specs, family, by_stored_name, target, builds).items():
        if reader is None:
            findings.append(Finding(Severity.WARNING, Kind.UNUSED_EXCLUSION, pattern, f"exclusion {pattern!r} matches no module of this model"))
        else:  # written for another runtime (fix --target a,b writes each one's spelling): harmless here
            notes.append(Finding(Severity.WARNING, Kind.UNUSED_EXCLUSION, pattern, f"exclusion {pattern!r} names no module as "
                                 f"{target.spec if target else 'this runtime'} reads it; {reader} reads it (another runtime's spelling)"))
    if declaration.ignore is not None and declaration.exclude_modules is not None and set(declaration.ignore) != set(declaration.exclude_modules):
        only_cfg = sorted(set(declaration.ignore) - set(declaration.exclude_modules))
        only_hf = sorted(set(declaration.exclude_modules) - set(declaration.ignore))
        findings.append(Finding(Severity.WARNING, Kind.CONFIGS_DISAGREE, "config.json / hf_quant_config.json",
                                f"the two config files disagree (only in config.json: {only_cfg}; only in hf_quant_config.json: {only_hf}); "
                                "vLLM reads config.json, TensorRT-LLM reads hf_quant_config.json"))
    for m in modules.values():
        linear = m.tensor("weight") and (specs[m.name].is_linear and specs[m.name].role != "embed" if m.name in specs else len(m.logical_shape) == 2)
        if not linear or family.unquantized_role(m.name, declaration) is not None:  # roles: unquantized_role_findings
            continue
        excluded = family.declared(m.name, declaration) == "excluded"
        if m.is_quantized and not declaration.quantized:
            findings.append(Finding(Severity.WARNING, Kind.CONFIG_CONTRADICTION, m.name, f"{m.name}: tensors are packed NVFP4 but the config declares no quantization"))
        elif m.is_quantized and excluded:
            findings.append(Finding(Severity.WARNING, Kind.CONFIG_CONTRADICTION, m.name, f"{m.name}: the config excludes it but its tensors are {'packed NVFP4' if m.precision == 'nvfp4' else m.algorithm}"))
        elif declaration.quantized and not m.is_quantized and not excluded:
            findings.append(Finding(Severity.WARNING, Kind.CONFIG_CONTRADICTION, m.name, f"{m.name}: the config declares it quantized but it is stored {m.precision}{_asked_as(family, m.name)}"))
    return findings, notes



def _asked_as(family: Architecture, module: str) -> str:
    """Why a module the config names is read as declared quantized: its layer is asked about under another name."""
    asked = family.asked_as(module)
    return "" if asked == module else (f" (the runtime builds it into {asked} and asks the config about that name "
                                       f"only: exclude {family.exclusion_name(asked)})")


def unquantized_role_findings(declaration: Declaration, modules: dict[str, StoredModule], family: Architecture,
                              own_roles: bool) -> list[Finding]:
    """Modules stored quantized in a role vLLM builds unquantized whatever the config says (a router, an embedding):
    vLLM allocates a full-precision weight there, which the packed weight does not fit and the scales have no
    parameter for. An error for a vLLM target; elsewhere (the roles are vLLM's knowledge) a warning."""
    severity = Severity.ERROR if own_roles else Severity.WARNING
    out = []
    for m in modules.values():
        role = family.unquantized_role(m.name, declaration) if m.is_quantized else None
        if role is not None:
            stored = "packed NVFP4" if m.precision == "nvfp4" else (m.algorithm or m.precision)
            out.append(Finding(severity, Kind.CONFIG_CONTRADICTION, m.name,
                               f"{m.name}: stored {stored}, but it is a {role.name}: {role.why}; vLLM builds it unquantized and "
                               "cannot load its quantized tensors; dequantize it (fix --target does)", repairs=(m.name,)))
    return out


def nvfp4_load_refusal_findings(modules: dict[str, StoredModule], family: Architecture, own_roles: bool) -> list[Finding]:
    """Modules stored packed NVFP4 where the profile recorded that the architecture's own load_weights fails on those
    tensors (Bloom reshapes every query_key_value tensor, its 0-d scales too): an error for the profile's runtime,
    elsewhere a warning (the rows are its knowledge)."""
    severity = Severity.ERROR if own_roles else Severity.WARNING
    return [Finding(severity, Kind.LOAD_ERROR, m.name, f"{m.name}: stored packed NVFP4, but {why}; store it BF16 and "
                                                       "exclude it (dequantize it)")
            for pattern, why in family.nvfp4_load_refused for m in modules.values()
            if m.precision == "nvfp4" and re.search(pattern, m.name)]


def fused_findings(declaration: Declaration, modules: dict[str, StoredModule], family: Architecture, target: Target) -> list[Finding]:
    """Fused layers whose shards the config declares at different precisions: the runtime refuses to build the model."""
    findings, who = [], target.profile.speaker
    for fused, stored in family.fused_groups(modules):
        # vLLM's reading (no rules file) asks every shard of the class's packed mapping, stored or not; a rules file's
        # own rule (SGLang, TensorRT-LLM) decides from its own mapping
        shards = family.asked_shards(fused, stored) if target.profile.rules is None else stored
        error = declaration.format.fused_refusal(family.runtime_name(fused), tuple(family.runtime_name(s) for s in shards),
                                                 declaration.rule())
        if error is None or not declaration.quantized:
            continue
        parent = fused.rpartition(".")[0]
        leaf = {s: s.removeprefix(f"{parent}.") for s in shards}
        excluded = [leaf[s] for s in shards if declaration.rule().shard_excluded(family.runtime_name(s))]
        unstored = [leaf[s] for s in shards if s not in stored]
        if unstored and excluded:
            findings.append(Finding(Severity.ERROR, Kind.FUSED_SHARDS, fused,
                                    f"{fused}: {who} builds {', '.join(leaf.values())} as one layer and asks the config about "
                                    f"each shard, also {', '.join(unstored)}, which this checkpoint does not store; the config "
                                    f"excludes {', '.join(excluded)} by name and not the others, so {who} refuses the model "
                                    f"while building it; name the fused layer itself ({family.exclusion_name(fused)}) in the config", error))
            continue
        if len(excluded) in (0, len(shards)):  # not a mix: the runtime cannot build the fused layer the config describes
            findings.append(Finding(Severity.ERROR, Kind.FUSED_SHARDS, fused,
                                    f"{fused}: {who} builds {', '.join(leaf.values())} as one layer, and the config "
                                    f"{'lists every shard' if excluded else 'lists no shard'} but says nothing {who} can "
                                    "apply to the fused layer, so it refuses the model while building it; name the layer "
                                    "in the config", error))
            continue
        findings.append(Finding(Severity.ERROR, Kind.FUSED_SHARDS, fused,
                                f"{fused}: {who} builds {', '.join(list(leaf.values())[:-1])} and {list(leaf.values())[-1]} as one layer, but the config excludes "
                                f"only {', '.join(excluded)}, so {who} refuses the model while building it; exclude every "
                                "shard by its exact name and dequantize the quantized ones, or exclude none", error))
    return findings


def health_findings(ckpt: Checkpoint, modules: dict[str, StoredModule], precision: dict[str, str], family: Architecture,
                    divisor: bool = False, values: ScaleValues | None = None, who: str = "vLLM",
                    experts: ExpertsRule | None = None, block_scale_dtype: str = "F32") -> list[Finding]:
    """Scale counts, shapes and values of every packed module, and the shared scale of siblings the target's class
    fuses (`family`: its row, whose fused layers are its release's own) and of each routed expert's gate/up (`experts`:
    which one the release keeps, its data) (the scale bytes come from `values`: what doctor decided to read, see
    doctor/scales.py); `who`: the target runtime, as messages name it; `block_scale_dtype`: its FP8 block scale
    parameter's dtype (Declaration.block_scale_dtype)."""
    located = ckpt.locate()
    findings = []
    scale_2: dict[str, float] = {}
    checks = HEALTH | {"fp8_block": partial(_fp8_block_health, held_as=block_scale_dtype)}
    with values or ScaleValues(ckpt, modules, divisor) as read:
        for m in sorted((m for m in modules.values() if m.is_quantized), key=lambda m: m.name):
            health = checks.get(m.precision, _module_health)
            findings += health(m, located, precision, scale_2, read, divisor)
    for _, siblings in family.scale_groups(scale_2):
        values = {name: scale_2[name] for name in siblings}
        if len(set(values.values())) > 1:
            runtime_fuses = all(precision.get(n) == "nvfp4" for n in values)
            findings.append(Finding(Severity.ERROR if runtime_fuses else Severity.WARNING, Kind.SIBLINGS_SCALE_2, ", ".join(values),
                                    f"fused siblings have different weight_scale_2 {values}; {who} takes the max without rescaling "
                                    "the block scales and loads the model without an error, so each shard with a smaller scale "
                                    "computes values too large by the ratio (requantize with --original)"))
    return findings + expert_scale_findings(scale_2, precision, experts, who)


def _module_health(m: StoredModule, located, precision, scale_2, read, divisor: bool) -> list[Finding]:
    out = []
    expected = block_scale_shape(m.logical_shape)
    scale_name = m.tensor("weight_scale")
    if scale_name is None:
        out.append(Finding(Severity.ERROR, Kind.MISSING_WEIGHT_SCALE, m.name, f"{m.name}: packed weight without weight_scale; it cannot be dequantized (use --original)"))
        return out
    scale = located[scale_name][1]
    stats = None
    if scale.shape != expected or scale.dtype != "F8_E4M3":
        out.append(Finding(Severity.ERROR, Kind.SCALE_SHAPE, scale_name,
                           f"{scale_name}: {scale.dtype} {list(scale.shape)}, expected F8_E4M3 {list(expected)}"))
    elif (stats := read.blocks(scale_name)) is not None:
        of = "" if stats.count == scale.nbytes else f" in a sample of {stats.count} of {scale.nbytes} (doctor --deep counts them all)"
        if stats.nan or stats.negative:
            out.append(Finding(Severity.ERROR, Kind.BLOCK_SCALES, scale_name, f"{scale_name}: {stats.nan} NaN and {stats.negative} negative block scales{of}"))
        if stats.zero:
            out.append(Finding(Severity.WARNING, Kind.BLOCK_SCALES, scale_name, f"{scale_name}: {stats.zero} zero block scales{of} (those blocks dequantize to 0)"))
    name2 = m.tensor("weight_scale_2")
    if name2 is None:
        out.append(Finding(Severity.ERROR, Kind.MISSING_SCALE_2, m.name, f"{m.name}: packed weight without weight_scale_2"))
    else:
        value, problem = _f32_scalar(located[name2], read)
        if problem:
            out.append(Finding(Severity.ERROR, Kind.GLOBAL_SCALE, name2, f"{name2} {problem}"))
        else:
            scale_2[m.name] = value
            out += _product_findings(m, name2, stats, value, divisor, located, read)
    name_in = m.tensor("input_scale")
    if name_in is not None and precision.get(m.name) == "nvfp4":
        problem = _f32_scalar(located[name_in], read)[1]
        if problem:
            out.append(Finding(Severity.ERROR, Kind.INPUT_SCALE, name_in, f"{name_in} {problem}; the runtime quantizes the layer's activations "
                               "with it, so the layer computes garbage (re-export, or dequantize the module)"))
    if name_in is None and precision.get(m.name) == "nvfp4":
        out.append(Finding(Severity.ERROR, Kind.MISSING_INPUT_SCALE, m.name,
                           f"{m.name}: no input_scale, but the runtime builds it W4A4 and skips its missing-weights check for "
                           "quantized models, so it runs with an uninitialised activation scale"))
    return out


def _product_findings(m: StoredModule, name2: str, stats, value: float, divisor: bool, located, read) -> list[Finding]:
    """What the dequantizer multiplies by (block scale x weight_scale_2, and an AWQ layer's pre_quant_scale folded into
    the weight), rounded to BF16: codec/scale_values.py, the function fix's plan and writer ask too. Only block scales
    read whole are kept (doctor/scales.py reads a module whole where scale_values.nvfp4_codes_needed says so)."""
    if stats is None or not stats.raw:
        return []
    problem = scale_values.nvfp4_problem(stats.raw, value, divisor, "BF16")
    if problem:
        kind, effect = (Kind.SCALE_OVERFLOW, "infinities") if problem.kind == "overflow" else (Kind.GLOBAL_SCALE, "zeros")
        return [Finding(Severity.ERROR, kind, name2, f"{name2}: {problem.text}; the layer computes {effect}")]
    name = m.tensor("pre_quant_scale")
    shard, info = located[name] if name else (None, None)
    if info is None or info.dtype not in FLOAT_BITS or info.shape != (m.logical_shape[1],):
        return []  # the plan's check names a pre_quant_scale of the wrong shape or dtype
    values = float_bits.to_float32(np.frombuffer(bytes(read(shard.path, info)), dtype=FLOAT_BITS[info.dtype]), info.dtype)
    problem = scale_values.pre_quant_scale_problem(values, scale_values.nvfp4_peak(stats.raw, value, divisor, "BF16"), "BF16")
    return [Finding(Severity.ERROR, Kind.PRE_QUANT_SCALE, name, f"{name}: {problem.text}")] if problem else []


def _fp8_health(m: StoredModule, located, precision, scale_2, read, divisor: bool) -> list[Finding]:
    """An FP8 (per-tensor) layer: a usable weight_scale, and an input_scale where the runtime builds it FP8."""
    out = []
    for role in ("weight_scale", "input_scale"):
        name = m.tensor(role)
        if name is None:
            if role == "input_scale" and precision.get(m.name) == "fp8":
                out.append(Finding(Severity.ERROR, Kind.MISSING_INPUT_SCALE, m.name, f"{m.name}: no input_scale, but the runtime builds "
                                   "it FP8 with a static activation scale, so it runs with an uninitialised one"))
            continue
        value, problem = _f32_scalar(located[name], read)
        if not problem and role == "weight_scale":  # the value the dequantizer multiplies by: rounded to BF16
            weight = located[m.tensor("weight")]
            found = scale_values.fp8_problem(value, "BF16", lambda: set(read(weight[0].path, weight[1])))
            problem = found.text if found else None
        if problem:
            out.append(Finding(Severity.ERROR, Kind.FP8_SCALE, name, f"{name} {problem}; the FP8 layer computes garbage "
                               "(re-export, or dequantize it from the original)"))
    return out


def _fp8_block_health(m: StoredModule, located, precision, scale_2, read, divisor: bool, held_as: str = "F32") -> list[Finding]:
    """An FP8 block layer: every 128x128 block's scale positive, finite and not past BF16 times the largest code (the
    runtime multiplies the block's codes by it; fix's dequantize refuses the same: codec/fp8_block.scale_problem), and,
    where the runtime's parameter is e8m0 (`held_as`) and the layer is built FP8 block, one it holds as stored. A ue8m0
    scale (e8m0fnu, a biased exponent per byte) is 2^(b-127); 0xFF is its NaN."""
    name = m.tensor("weight_scale")
    shard, info = located[name]
    raw = np.frombuffer(bytes(read(shard.path, info)), dtype=np.uint8 if info.dtype == "F8_E8M0" else "<f4")
    values = fp8_block.scales(raw, info.dtype)
    problem = fp8_block.scale_problem(values, "BF16")
    if problem:
        return [Finding(Severity.ERROR, Kind.FP8_SCALE, name, f"{name}: {problem}; those 128x128 blocks of the FP8 layer "
                        "compute garbage (re-export, or take the layer from the original)")]
    rounded = fp8_block.e8m0_inexact(values) if held_as == "F8_E8M0" and info.dtype != "F8_E8M0" else 0
    if not rounded or precision.get(m.name) != "fp8_block":
        return []
    return [Finding(Severity.ERROR, Kind.FP8_SCALE, name, f"{name}: {rounded} of {values.size} {info.dtype} block scales are not a "
                    "power of two in e8m0's range, but the runtime's block scale parameter is float8_e8m0fnu (DeepSeek-V4 "
                    "expert_dtype fp4) and the load rounds each to one, so those blocks compute with another scale than "
                    "the export's; store the scales the export computed with, or dequantize the layer (fix --target bf16)")]


HEALTH = {"fp8": _fp8_health, "fp8_block": _fp8_block_health}  # by stored precision


def _f32_scalar(located_scale, read) -> tuple[float, str | None]:
    """A global or input scale's value and why it is unusable (None: a positive finite float32 scalar)."""
    shard, info = located_scale
    if info.dtype != "F32" or info.nbytes != 4:
        return float("nan"), f"is {info.dtype} {list(info.shape)}, not a float32 scalar"
    value = read_f32_scalar(shard.path, info, read)
    return value, global_scale_problem(value)

