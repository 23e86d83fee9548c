"""`doctor`: what is stored against what a target runtime allocates, with the runtime's own errors.

Findings are errors (will not load, or loads wrong values) or warnings (loads, but against the
model's intended precision or with inconsistent metadata). Everything here reads headers, the
config files and the scale bytes doctor/scales.py decides on; torch is never imported.
"""

from __future__ import annotations

from repair import arch, formats
from repair.arch import Architecture, ModuleSpec
from repair.arch.registry import Builds, Resolved, shown
from repair.doctor.built_layers import built_layer_findings
from repair.doctor.checks import (config_findings, fused_findings, health_findings, nvfp4_load_refusal_findings,
                                  unquantized_role_findings)
from repair.doctor.declared import (algorithm_findings, float8_findings, fused_algorithm_findings, kv_cache_findings,
                                    kv_scale_health, layer_map_findings, nested_algo_findings, null_list_findings,
                                    refused_algorithm, runtime_refusal_findings)
from repair.doctor.dropped import dropped_tensor_findings, unread_tensors
from repair.doctor.expert_scales import experts_fact
from repair.doctor.config_builds import refused_config_findings, unexpected_tensor_findings
from repair.doctor.config_types import model_type_refusal
from repair.doctor.layer_values import layer_value_refusal
from repair.doctor.refused_load import build_refused_findings, load_refused_findings, registry_findings
from repair.doctor.fix_hints import true_hints
from repair.doctor.findings import Diagnosis, Finding, Kind, Severity
from repair.doctor.fused import fused_storage_findings, said_by_fused
from repair.doctor.moe_schemes import moe_scheme_findings
from repair.doctor.sparse_24 import sparse_24_findings
from repair.doctor.missing import consequence, missing_findings, unbuilt
from repair.doctor.module_loads import load_stops, module_driven, module_load_findings, replaced_by_loads
from repair.doctor.scales import BlockReads, Progress, ScaleValues
from repair.doctor.schemes import excluded_packed_findings, predicted_schemes, scheme_findings, unloadable_full_precision_findings
from repair.doctor.table_loads import table_loads
from repair.doctor.unlisted import unlisted_findings
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule, stored_bits
from repair.io.checkpoint import HF_QUANT_CONFIG, Checkpoint
from repair.io.parse import collector_paused
from repair.targets import tp_rules, vllm_loader
from repair.targets.layer_names import target_family
from repair.targets.precision import runtime_precision, stored_precision
from repair.targets.profiles import Target, read_builds

__all__ = ["Diagnosis", "Finding", "diagnose"]
BUILD_STOPS = (Kind.NULL_EXCLUSIONS, Kind.QUANT_CONFIG, Kind.FUSED_SHARDS)  # refusals before any weight loads


def diagnose(ckpt: Checkpoint, target: Target, tp: int = 1, *, deep: bool = False, progress: Progress | None = None,
             shared: BlockReads | None = None, builds: Builds | None = None) -> Diagnosis:
    """What `target` does with `ckpt` at `tp`; `deep` reads every NVFP4 block scale (see doctor/scales.py for what
    is read without it; `progress` makes the bar of a deep scan). Nothing is remembered between calls: `fix` asks
    once per target and passes the Diagnosis along (derived recipe, plan check, the report's 'before'); `shared`
    carries one checkpoint's block-scale reads from one target's diagnosis to the next (diagnose_each), `builds` the
    class each release builds for its config.json (read_builds: each listed name read once per release, not per check)."""
    tp_rules.check_ranks(tp, "doctor simulates each rank")
    with collector_paused():  # ~10 objects per module, no cycles: see io/parse.py
        return _diagnose(ckpt, target, tp, deep, progress, shared, builds or read_builds(ckpt.config))


def diagnose_each(ckpt: Checkpoint, targets: tuple[Target, ...], tp: int = 1, *, deep: bool = False,
                  progress: Progress | None = None) -> tuple[Diagnosis, ...]:
    """One Diagnosis per target (`--target a,b,c`), in their order; the block scales are read (and, with `deep`,
    scanned) once for all of them: they are the checkpoint's, not a target's."""
    shared, builds = {}, read_builds(ckpt.config)
    return tuple(diagnose(ckpt, t, tp, deep=deep, progress=progress, shared=shared, builds=builds) for t in targets)


def _diagnose(ckpt: Checkpoint, target: Target, tp: int, deep: bool, progress: Progress | None, shared: BlockReads | None,
              builds: Builds) -> Diagnosis:
    resolved = target.built(builds)  # which listed class the target builds: decided here, obeyed by every check below
    family = target_family(target, ckpt.config, builds)
    infos, unread = unread_tensors(ckpt.infos(), family, target)  # its weight mapper drops them: no check applies
    fmt = formats.detect(ckpt)
    modules = {m.name: m for m in fmt.group_modules(infos)}
    refusal = model_type_refusal(ckpt.config, target, tp)  # its config reader refuses it: nothing else is ever asked
    refusal = refusal or layer_value_refusal(ckpt.config, target, resolved, tp)  # so does a per-layer value it cannot build
    if refusal is not None:
        return Diagnosis(target, tp, (refusal,), _build_stops([refusal], tp, (refusal.code,)), {}, stored_bits(
            [m for m in modules.values() if m.tensor("weight")], infos), architecture_name(builds, resolved, ckpt.config), family=family)
    declaration = target.bind(fmt.read_declaration(ckpt), family, ckpt.config, resolved)
    specs = arch.expected_modules(ckpt.config, str(ckpt.root / "config.json"), family) or {}
    precision = runtime_precision(specs, declaration, target, family)
    findings: list[Finding] = []
    first: tuple[vllm_loader.Outcome, ...] = ()
    building: list[Finding] = []  # layers the runtime refuses while building them
    simulated = target.profile.simulates_loads and bool(specs)
    degree = _degree_findings(specs, precision, ckpt.config, tp, family.layer_kinds) if simulated else []
    findings += degree
    nested = nested_algo_findings(ckpt, target)  # the config reader raises: no layer is built, no weight loads
    null = null_list_findings(ckpt, declaration, target) + nested
    first = _build_stops(null, tp)
    if simulated and not degree and not null:  # an impossible degree fails before any weight loads
        located = ckpt.locate()
        order = sorted(infos.values(), key=lambda i: (vllm_loader.shard_order(located[i.name][0].path.name), i.name))  # as vLLM reads them
        outcomes = vllm_loader.simulate(order, specs, precision, target, tp, fmt.RUNTIME_LEAVES, kinds=family.layer_kinds)
        first = _first_error_per_rank(outcomes)
        findings += _load_findings(outcomes, modules, specs, precision, target, declaration)
    if target.profile.simulates_loads and not specs and not declaration.quantized:
        stop = _unquantized_stop(ckpt, modules)
        first = (stop,) if stop else ()
        findings += _unquantized_stop_findings(stop, modules)
    if not target.profile.allows_quant_config:
        findings += _bf16_findings(ckpt, modules)
    findings += _handshake_findings(modules, precision, target, family)
    findings += [] if nested else runtime_refusal_findings(declaration, target, ckpt.config)  # its ModelOpt config never reads it
    findings += null
    config, config_notes = config_findings(ckpt, declaration, modules, specs, family, module_driven(target), target, builds)
    findings += config
    findings += unquantized_role_findings(declaration, modules, family, target.profile.knows_layer_roles)
    findings += nvfp4_load_refusal_findings(modules, family, target.profile.knows_layer_roles)
    findings += dropped_tensor_findings(infos, family, target, declaration.quantized)
    name = architecture_name(builds, resolved, ckpt.config)
    refused, refused_notes = load_refused_findings(family, target, name, tp)
    not_built, not_built_notes = build_refused_findings(target, name, ckpt.config, tp)
    unregistered, backend = registry_findings(target, builds, ckpt.config, tp)
    unlisted, unlisted_notes = unlisted_findings(target, builds, ckpt.config, tp)
    findings += not_built + refused + unregistered + unlisted + refused_config_findings(family, target, tp)
    findings += unexpected_tensor_findings(ckpt, family, target, tp)
    backend += unlisted_notes
    # without a loader profile (no specs), what the target builds each stored quantized module as, for the health checks
    built = precision if specs else stored_precision([m.name for m in modules.values() if m.is_quantized], declaration, target, family)
    mismatched, notes = algorithm_findings(declaration, modules, specs, family, precision)
    findings += layer_map_findings(declaration) + mismatched
    kv_cache, kv_notes = kv_cache_findings(declaration, infos)
    notes += unread + kv_notes + config_notes + backend + refused_notes + not_built_notes
    findings += kv_cache + kv_scale_health(ckpt, declaration)
    if target.profile.allows_quant_config:
        building = fused_findings(declaration, modules, family, target) + fused_algorithm_findings(declaration, modules, family, target)
        building += moe_scheme_findings(modules, declaration, family, target) + sparse_24_findings(modules, declaration, family, target)
        findings += building
        findings += built_layer_findings(declaration, target, ckpt.config, resolved)
    if target.profile.rules is None:  # a rules file's loader table says what a shard that does not fit does (table_loads)
        findings += fused_storage_findings(declaration, modules, family, target)
    findings += float8_findings(modules, infos) + missing_findings(
        infos, specs, family.name, ckpt.config, unbuilt(target, family, ckpt.config),
        consequence(target, declaration.quantized), family.required_modules)
    said = {f.subject for f in mismatched}  # a layer declared NVFP4 stored without input_scale: said once, as a mismatch
    with ScaleValues(ckpt, modules, fmt.GLOBAL_SCALE_IS_DIVISOR, deep, progress, shared) as values:
        findings += [f for f in health_findings(ckpt, modules, built, family, fmt.GLOBAL_SCALE_IS_DIVISOR, values,
                                                  target.profile.speaker, experts_fact(target, declaration, name),
                                                  declaration.block_scale_dtype)
                     if not (f.code == Kind.MISSING_INPUT_SCALE and f.subject in said)]
        # a module-driven loader (TensorRT-LLM's copy_weight): its own account, from its data (scalars read as above)
        module_loads = module_load_findings(ckpt, modules, declaration, target, tp, family, values, resolved) if module_driven(target) else None
    if not specs or (target.profile.allows_quant_config and not simulated):
        precision = predicted_schemes(modules, declaration, family, target)
        findings += scheme_findings(modules, precision, declaration, family, target)
        excluded = excluded_packed_findings(modules, precision, declaration, family, target)
        excluded += unloadable_full_precision_findings(modules, precision, declaration, family, target)
        apart = said_by_fused(findings, modules, family)  # a shard stored apart: the fused-shards error says it all
        excluded = [f for f in excluded if f.subject not in apart]
        refused = refused_algorithm(declaration, target, ckpt.config) or any(f.code == Kind.NULL_EXCLUSIONS for f in findings)  # the config is refused before any layer is built
        loads, first = table_loads(modules, precision, ckpt, target, family, tp, fmt.RUNTIME_LEAVES, resolved, declaration) \
            if target.profile.rules and not refused and not module_driven(target) else ([], first)
        first = _build_stops(findings, tp) if target.profile.rules and _build_stops(findings, tp) else first
        excluded = [f for f in excluded if f.subject not in {g.subject for g in loads}]  # the loader's outcome says more
        said = {f.subject for f in excluded + loads}  # the same contradiction, now an error: said once
        findings = [f for f in findings if not (f.code == Kind.CONFIG_CONTRADICTION and f.subject in said)] + excluded + loads
    if module_loads is not None:
        loads, precision = module_loads
        findings = [f for f in findings if not replaced_by_loads(f)] + loads
        first = load_stops(loads, tp) or first
    # a layer refused while built stops every rank before load_weights, which raises on every rank
    first = first or _build_stops(building, tp) or _build_stops(findings, tp, (Kind.LOAD_REFUSED, Kind.UNEXPECTED_TENSOR))
    first = _build_stops(findings, tp, (Kind.BUILD_REFUSED,)) or first  # its own model code refuses to build it
    first = _build_stops(findings, tp, (Kind.UNREGISTERED, Kind.CONFIG_REFUSED)) or first  # refused reading the config: before all
    linears = [m for m in modules.values() if m.tensor("weight")]
    bits = stored_bits(linears, infos)
    findings = true_hints(findings)  # what fix --target does with each: said after every finding is known
    return Diagnosis(target, tp, tuple(findings), first, precision, bits, architecture_name(builds, resolved, ckpt.config), simulated,
                     tuple(notes), values.report(), family)


def architecture_name(builds: Builds, resolved: Resolved, config: dict | None) -> str:
    """The listed model class the target builds (`resolved`, else the first listed, else the model_type), as messages
    show it."""
    name = resolved.name or builds.unrecorded.name
    return shown(name or str((config or {}).get("model_type") or "this model"))


def _unquantized_stop(ckpt: Checkpoint, modules: dict[str, StoredModule]) -> vllm_loader.Outcome | None:
    """Packed tensors and no quantization config: vLLM builds every linear unquantized (a BF16 `weight` parameter
    only) and stops at the first tensor of a packed module it meets in load order: a scale names a parameter that
    does not exist; a packed weight is half as wide as the parameter it is loaded into."""
    owner = {t: m for m in modules.values() if m.is_quantized for t in m.tensors}
    located = ckpt.locate()
    order = sorted(owner, key=lambda t: (located[t][0].path.name, t))
    if not order:
        return None
    tensor, module = order[0], owner[order[0]]
    if tensor != module.tensor("weight"):
        name = tensor.removeprefix("model.")  # the name vLLM's inner model sees (its loader descends into `model`)
        return vllm_loader.Outcome(tensor, 0, "error", f"ValueError: There is no module or parameter named {name!r}")
    info = located[tensor][1]
    return vllm_loader.Outcome(tensor, 0, "error", f"a shape error: the stored {info.dtype} {list(info.shape)} does not fit the "
                                                   f"BF16 {list(module.logical_shape)} weight vLLM allocates")


def _unquantized_stop_findings(stop: vllm_loader.Outcome | None, modules: dict[str, StoredModule]) -> list[Finding]:
    if stop is None:
        return []
    module = next(m.name for m in modules.values() if stop.tensor in m.tensors)
    return [Finding(Severity.ERROR, Kind.LOAD_ERROR, module,
                    f"{module}: stored packed NVFP4 but the config declares no quantization, so vLLM builds every linear "
                    f"unquantized and stops at {stop.tensor} (restore the quantization "
                    "config, or dequantize the packed modules)", stop.error if stop.error.startswith("ValueError") else None, (0,))]


def _degree_findings(specs, precision, config, tp: int, kinds: dict) -> list[Finding]:
    """An impossible --tp: vLLM fails while building the model, on every rank; lists the degrees that work. `kinds`:
    the layer kinds of the class the target builds."""
    built = tp_rules.runtime_specs(specs, precision, config, kinds)
    found = tp_rules.problems(built, tp)
    works = tp_rules.degrees_text(tp_rules.valid_degrees(built)) if found else ""
    return [Finding(Severity.ERROR, Kind.TP_IMPOSSIBLE, p.tensor, f"{p.tensor}: {p.rule}, so tensor parallel {tp} is impossible; "
                    f"degrees that work: {works}", p.runtime_error, tuple(range(tp))) for p in found]


def _build_stops(findings: list[Finding], tp: int, kinds: tuple[Kind, ...] = BUILD_STOPS) -> tuple[vllm_loader.Outcome, ...]:
    """Where every rank stops when the runtime refuses the model while reading the config or building a layer (before
    any weight loads), or (`kinds`: LOAD_REFUSED) its own load_weights fails whatever the checkpoint: the first such error."""
    refused = [f for f in findings if f.code in kinds and f.severity is Severity.ERROR and f.runtime_error]
    return tuple(vllm_loader.Outcome(refused[0].subject, r, "error", refused[0].runtime_error) for r in range(tp)) if refused else ()


def _first_error_per_rank(outcomes: list[vllm_loader.Outcome]) -> tuple[vllm_loader.Outcome, ...]:
    firsts: dict[int, vllm_loader.Outcome] = {}
    for o in outcomes:
        if o.status == "error" and o.rank not in firsts:
            firsts[o.rank] = o
    return tuple(firsts[r] for r in sorted(firsts))


def _load_findings(outcomes, modules, specs, precision, target, declaration) -> list[Finding]:
    """One finding per module whose tensors fail or load wrong values on some rank."""
    by_module: dict[str, list[vllm_loader.Outcome]] = {}
    for o in outcomes:
        if o.status in ("error", "garbage", "skipped", "unloaded"):
            by_module.setdefault(_module_of(o.tensor, specs), []).append(o)
    findings = []
    for name, items in sorted(by_module.items()):
        stored = modules.get(name)
        errors = [o for o in items if o.status == "error"]
        garbage = [o for o in items if o.status == "garbage"]
        unloaded = [o for o in items if o.status == "unloaded"]
        what = _mismatch_text(name, stored, precision.get(name, "bf16"), target, declaration)
        if unloaded:
            what += (f"; it skips {unloaded[0].tensor} as an unknown name, so the layer's weight is never loaded and it "
                     "runs on uninitialised memory, silently")
        if garbage:
            what += f"; on rank(s) {sorted({o.rank for o in garbage})} the bytes fit and load as wrong values, silently"
            if stored is not None and not stored.is_quantized and precision.get(name) == "nvfp4":
                what += (" (vLLM 0.32 then stops after loading with 'RuntimeError: NVFP4 weight_scale for layer ... "
                         "was never loaded (still NaN)', because this layer's scales are missing)")
        if errors:
            findings.append(Finding(Severity.ERROR, Kind.LOAD_ERROR, name, what, errors[0].error, tuple(sorted({o.rank for o in errors}))))
        elif garbage or unloaded:
            findings.append(Finding(Severity.ERROR, Kind.SILENT_GARBAGE, name, what, None, tuple(sorted({o.rank for o in garbage + unloaded}))))
        else:
            findings.append(Finding(Severity.WARNING, Kind.IGNORED_TENSORS, name, f"{target.spec} silently ignores {', '.join(sorted({o.tensor for o in items}))}"))
    return findings


def _module_of(tensor: str, specs: dict[str, ModuleSpec]) -> str:
    module = tensor.rpartition(".")[0]
    return module if module in specs else tensor


def _mismatch_text(name: str, stored: StoredModule | None, built: str, target: Target, declaration: Declaration) -> str:
    if stored is None:
        return f"{name}: not stored"
    why = "builds every drafter linear in BF16" if not target.profile.follows_draft_config else (
        "follows the config, which excludes it" if built == "bf16" and declaration.quantized else
        "follows the config, which declares no quantization" if built == "bf16" else
        "follows the config, which declares it quantized")
    return (f"{name}: stored {stored.precision} {list(stored.stored_shape)} but {target.spec} {why} "
            f"({built} {list(stored.logical_shape) if built == 'bf16' else [stored.logical_shape[0], stored.logical_shape[1] // 2]})")


def _bf16_findings(ckpt: Checkpoint, modules: dict[str, StoredModule]) -> list[Finding]:
    findings = [Finding(Severity.ERROR, Kind.NOT_BF16, m.name, f"{m.name}: stored {m.precision}; a plain BF16 checkpoint has no quantized tensors")
                for m in modules.values() if m.is_quantized]
    if ckpt.config and "quantization_config" in ckpt.config:
        findings.append(Finding(Severity.ERROR, Kind.QUANT_CONFIG, "config.json", "config.json has a quantization_config; a plain BF16 checkpoint has none"))
    if ckpt.hf_quant_config is not None:
        findings.append(Finding(Severity.ERROR, Kind.QUANT_CONFIG, HF_QUANT_CONFIG, f"{HF_QUANT_CONFIG} exists; a plain BF16 checkpoint has none"))
    return findings


def _handshake_findings(modules, precision, target, family: Architecture) -> list[Finding]:
    """Packed handshake layers that the target would load quantized: legal, but not the family's design."""
    out = []
    for name in family.bf16_handshake:
        m = modules.get(name)
        if m is not None and m.is_quantized and precision.get(name) == "nvfp4" and target.profile.follows_draft_config:
            out.append(Finding(Severity.WARNING, Kind.HANDSHAKE_QUANTIZED, name,
                               f"{name}: stored and declared NVFP4; {target.spec} loads it, but the Gemma 4 family keeps this "
                               "handshake layer in BF16 (as the corrected upstream export does)"))
    return out
