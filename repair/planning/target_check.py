"""`fix --target T` promises an output that `doctor --strict` passes for T; refuse, before writing, what it cannot.

The derived recipe settles a finding by changing its module (dequantize: the layer becomes BF16 and excluded,
which settles an algorithm the tensors contradict, a layout the runtime cannot build, a missing activation scale),
by dropping KV-cache scales nothing declares, or by dropping the quantization config. What no target's repair
settles is refused here: a broken or missing scale of a layer the output keeps (NaN / infinite / zero weight
scale, bad block scales, fused siblings' different global scales, a broken input or KV-cache scale), which needs
the original model (--original with a take_original or requantize rule) or a fresh export; a module the
architecture expects but the checkpoint lacks; and config entries the plan does not edit (an exclusion that
matches nothing, two quantized_layers maps that disagree). The writer checks doctor on the output again.
"""

from __future__ import annotations

from repair import arch
from repair.arch.load_refusals import WEIGHT_REMEDY, WITHOUT_REMEDY
from repair.doctor.config_builds import unexpected_tensor_findings
from repair.doctor.declared import UNSCALED_ADVICE
from repair.doctor.expert_scales import settled_by
from repair.doctor.fix_hints import module_of
from repair.doctor.findings import Diagnosis, Finding, Kind, Severity
from repair.doctor.missing import missing_modules, unbuilt as not_built
from repair.errors import BadInput, UsageError
from repair.formats.base import Declaration, routed_layer
from repair.io.checkpoint import Checkpoint
from repair.planning.built import built_family
from repair.planning.from_target import recipe_for_target
from repair.planning.recipe import Action, Recipe

STORED_DEFECTS = frozenset({Kind.GLOBAL_SCALE, Kind.FP8_SCALE, Kind.BLOCK_SCALES, Kind.SCALE_OVERFLOW, Kind.MISSING_WEIGHT_SCALE,
                            Kind.MISSING_SCALE_2, Kind.SCALE_SHAPE, Kind.INPUT_SCALE, Kind.KV_CACHE_SCALES, Kind.SIBLINGS_SCALE_2,
                            Kind.EXPERTS_SCALE_2, Kind.MISSING_MODULE, Kind.PRE_QUANT_SCALE})
CONFIG_FINDINGS = frozenset({Kind.QUANT_CONFIG, Kind.NOT_BF16, Kind.UNUSED_EXCLUSION, Kind.CONFIGS_DISAGREE})  # gone with the config
ADVICE = {Kind.UNUSED_EXCLUSION: "remove the entries that match nothing from the config's exclusion lists",
          Kind.CONFIGS_DISAGREE: "make the two config files' quantized_layers agree",
          Kind.MISSING_MODULE: "re-download or re-export the checkpoint (or take the module from the original model)",
          Kind.DROPPED_TENSOR: "no change to the files makes this release read the tensor: serve the model with a release "
                               "whose model code does, or fix for another target",
          Kind.LOAD_REFUSED: "no change to the files makes this release load the model (doctor says which releases do); "
                             "fix for another target",
          Kind.UNSCALED_FLOAT8: UNSCALED_ADVICE,
          Kind.BUILD_REFUSED: "this release's own model code refuses to build the model from this config (doctor says "
                              "which field and which releases build it); fix for another target",
          Kind.CONFIG_REFUSED: "correct config.json where the release's validation refuses it: every field of that build "
                               "set to a value it takes, or all of them null (doctor says which, in its words)",
          Kind.UNEXPECTED_TENSOR: "remove the tensors the release's build has no parameter for, or set the config fields "
                                  "that build them (doctor says which)",
          Kind.UNREGISTERED: "name the model's class as the release registers it in config.json's `architectures` "
                             "(doctor says which releases build one), or fix for another target"}
UNSETTLED = (Kind.MISSING_MODULE, Kind.DROPPED_TENSOR, Kind.LOAD_REFUSED, Kind.UNREGISTERED, Kind.CONFIG_REFUSED,
             Kind.UNEXPECTED_TENSOR, Kind.BUILD_REFUSED, Kind.UNSCALED_FLOAT8)  # no plan's change settles these
FIRST = (Kind.UNREGISTERED, Kind.CONFIG_REFUSED, Kind.BUILD_REFUSED, Kind.LOAD_REFUSED, Kind.UNEXPECTED_TENSOR)  # the model is refused whole: named first
# findings that end with their own remedy (arch/load_refusals.py: QSA's `without` fields, or storing a `weight_refused`
# module as the release loads it: no config field builds MiniCPMMoE's NVFP4 expert scales), said in place of ADVICE's
OWN_REMEDIES = {Kind.UNEXPECTED_TENSOR: (WITHOUT_REMEDY, WEIGHT_REMEDY)}
DEFAULT_ADVICE = ("re-download or re-export the checkpoint, or repair those modules with a recipe (--original to take or "
                  "requantize them)")


def refuse_unrepairable(ckpt: Checkpoint, recipe: Recipe, declaration: Declaration, actions: dict[str, Action],
                        before: tuple[Diagnosis, ...]) -> None:
    """One line naming the first finding doctor --strict reports, for one of the recipe's targets (doctor's verdicts
    on the input, `before`), that its plan leaves."""
    if not recipe.from_target:
        return
    dropped = frozenset(n for n, a in actions.items() if a == Action.DROP)
    _refuse_dropped_expected(ckpt, recipe.from_target, set(dropped), before)
    changed = {n for n, a in actions.items() if a != Action.KEEP}
    for diagnosis in before:
        fused = built_family(ckpt, diagnosis).one_parameter_layers  # the layers of the class this target builds
        left = [f for f in diagnosis.findings if f.severity in (Severity.ERROR, Severity.WARNING)
                and not _settled(f, changed, recipe, declaration, fused) and not _dropped_away(f, ckpt, diagnosis, dropped)]
        if left:
            raise _unnameable(ckpt, diagnosis, left) or cannot_repair(ckpt.root, diagnosis.target.spec, left)


def refuse_empty_plan(ckpt: Checkpoint, recipe: Recipe, noop: bool, before: tuple[Diagnosis, ...]) -> None:
    """The net under refuse_unrepairable: a --target plan that changes nothing leaves every finding doctor --strict
    reported for the input, so it never says "nothing to fix" for a target doctor finds an error (or warning) for."""
    if not recipe.from_target or not noop:
        return
    for diagnosis in before:
        left = [f for f in diagnosis.findings if f.severity in (Severity.ERROR, Severity.WARNING)]
        if left:
            raise _unnameable(ckpt, diagnosis, left) or cannot_repair(ckpt.root, diagnosis.target.spec, left)


def load_doubts(before: tuple[Diagnosis, ...]) -> list[str]:
    """doctor's notes that a target may not load the model whatever its files say (a release past every profile that
    records its load failure or registry refusal): fix is not refused for those, so it says them, once per target."""
    return [f"note for {d.target.spec}: [{n.code}] {n.message}" for d in before for n in d.notes if n.code in FIRST]


def unused_exclusions(ckpt: Checkpoint, recipe: Recipe, before: tuple[Diagnosis, ...], modules, fmt,
                      dropped: frozenset[str] = frozenset()) -> frozenset[str]:
    """The exclusion entries doctor finds matching no module (unused-exclusion), which `--target` takes out of the
    config: harmless to the runtime, but doctor --strict, which the target promises, counts them (a real ModelOpt
    export lists e.g. an EAGLE draft's unstored `model.embed_tokens`, DeepSeek-R1 61 layers it does not have). One
    target's unused entry stays where another target reads it as the exact entry of a stored module under its own
    names: the plan's exclusion writer counts on it (it adds no entry already listed). HYV3's stored-name
    `shared_mlp.down_proj` is unused to vLLM 0.28 (it asks `mlp.down_proj`) and read by 0.32. An entry a target reads
    only as a pattern (`mlp.down_proj`, a substring to vLLM, nothing to TensorRT-LLM's fnmatch) goes: the plan writes
    exact entries for what it excluded. A routed expert's entry is no stored module's to any target (each MoE is asked
    by its layer's name): the plan names that layer whole where a target does not read the expert entries. The exact
    entry is the format's spelling or the module's plain name: a compressed-tensors export listing `post_projection`
    for TensorRT-LLM < 1.3 (no `re:`) keeps it under --target vllm,trtllm==1.2 (vLLM asks `draft_model.` names). An entry
    only a release outside the fix's targets reads (doctor's note, not a warning) is one no target reads: it goes too.
    So does an entry naming exactly a module a drop rule removes (`dropped`): the output would match nothing with it,
    and vLLM asks it as a fused layer's shard (Qwen4Exp's listed indexer projection, without QSA: qkv_proj's fourth)."""
    if not recipe.from_target or recipe.drop_quantization:
        return frozenset()
    gone = _entries_of(dropped, fmt, [built_family(ckpt, d) for d in before])
    reading = [d for d in before if d.target.profile.allows_quant_config]  # bf16 reads no exclusion list
    flagged = [{f.subject for f in d.findings + d.notes if f.code == Kind.UNUSED_EXCLUSION} for d in reading]  # notes: read elsewhere
    found = set().union(*flagged)
    disputed = found - set.intersection(*flagged) if flagged else set()
    for d, unused in zip(reading, flagged):
        if read := disputed - unused:  # only when targets disagree: one pass over the modules per such target
            family = built_family(ckpt, d)
            names = [family.exclusion_name(m) for m in modules if routed_layer(m) == m]  # in the format's spelling or as
            found -= read & ({fmt.exclusion_entry(n) for n in names} | set(names))  # the plain name (TensorRT-LLM < 1.3)
    listed = {e for entries in fmt.exclusion_lists(ckpt.config, ckpt.hf_quant_config) for e in entries if isinstance(e, str)}
    return frozenset(found) | (gone & listed)


def _entries_of(modules: frozenset[str], fmt, families: list) -> set[str]:
    """The exact entries naming these modules: their names and the format's spelling, under each target's names too."""
    names = set(modules) | {f.exclusion_name(m) for f in families for m in modules}
    return names | {fmt.exclusion_entry(n) for n in names}


def _refuse_dropped_expected(ckpt: Checkpoint, target: str, dropped: set[str], before: tuple[Diagnosis, ...]) -> None:
    """A drop rule whose output would lack a module the architecture expects (doctor: missing-module) for one of the
    targets: each target's expectations are those of the class its release builds (its row, doctor's decision)."""
    if not dropped:
        return
    names = ckpt.infos()
    for diagnosis in before:
        row = built_family(ckpt, diagnosis)
        specs = arch.expected_modules(ckpt.config, str(ckpt.root / "config.json"), row) or {}
        unbuilt = not_built(diagnosis.target, row, ckpt.config)
        had = missing_modules(names, specs, row.name, ckpt.config, unbuilt, row.required_modules)
        after = missing_modules((t for t in names if t.rpartition(".")[0] not in dropped), specs, row.name, ckpt.config,
                                unbuilt, row.required_modules)
        lost = [n for n in after if n not in had]
        if lost:
            raise UsageError(f"{ckpt.root}: the drop rule removes {lost[0]}, but {after[lost[0]]}, so the output would lack "
                             f"it and not pass doctor --strict for --target {target}; nothing was written; leave it out of the "
                             "drop rule")


def _settled(f: Finding, changed: set[str], recipe: Recipe, declaration: Declaration, fused: dict[str, tuple[str, ...]]) -> bool:
    """Whether the plan (its changed modules and config edits) takes finding `f` away."""
    if f.code in UNSETTLED:
        return False
    if f.code == Kind.NULL_EXCLUSIONS:
        return True  # the plan writes a list where the runtime reads the null one (config_edits.config_edits)
    if (f.code == Kind.CONFIG_CONTRADICTION or f.config_bound) and recipe.drop_quantization:
        return True  # the config's claim goes with it, and every packed module is dequantized (build._check_supported)
    if f.code in CONFIG_FINDINGS or f.code == Kind.KV_CACHE_SCALES:
        if recipe.drop_quantization or (f.code == Kind.KV_CACHE_SCALES and declaration.kv_cache is None):
            return True  # the config (and its KV-cache scales) go, or undeclared KV scales are dropped
        if f.code == Kind.CONFIGS_DISAGREE:  # the plan aligns exclusion lists it rewrites, never quantized_layers maps
            return declaration.layer_algos is None or declaration.hf_layer_algos is None or \
                declaration.layer_algos.as_dict() == declaration.hf_layer_algos.as_dict()
        if f.code == Kind.UNUSED_EXCLUSION:  # the plan takes such entries out (unused_exclusions)
            return True
        if f.code in CONFIG_FINDINGS:
            return False
    if f.code == Kind.FUSED_SHARDS:  # settled by dequantizing its shards (subject: parent.fused_name)
        parent, _, layer = f.subject.rpartition(".")
        return any(f"{parent}.{shard}" in changed for shard in fused.get(layer, ())) or _covered(f.subject, changed)
    if f.code == Kind.EXPERTS_SCALE_2:  # subject: the expert
        return settled_by(f.subject, changed)
    members = f.subject.split(", ") if f.code == Kind.SIBLINGS_SCALE_2 else [f.subject]
    return all(_covered(m, changed) for m in members)


def _dropped_away(f: Finding, ckpt: Checkpoint, diagnosis: Diagnosis, dropped: frozenset[str]) -> bool:
    """A stored tensor the release's build has no parameter for goes with the modules a drop rule leaves out (doctor's
    advice for a config without the build that reads them): settled when the release raises that error on none kept.
    fix --target never drops them itself: the config's fields may be what is wrong, and only the user knows."""
    if f.code != Kind.UNEXPECTED_TENSOR or not dropped:
        return False
    family = built_family(ckpt, diagnosis)
    kept = unexpected_tensor_findings(ckpt, family, diagnosis.target, diagnosis.tp, dropped)
    return f.runtime_error not in {g.runtime_error for g in kept}


def _covered(subject: str, changed: set[str]) -> bool:
    """`subject` (a module or one of its tensors) belongs to a module the plan changes."""
    if module_of(subject) in changed:  # ModelOpt BMM experts' `X_weight_scale` is a tensor of module X
        return True
    name = subject
    while name:
        if name in changed:
            return True
        name = name.rpartition(".")[0]
    return False


def contradiction(ckpt: Checkpoint, before: tuple[Diagnosis, ...], target: str, new: list[Finding]) -> BadInput | None:
    """Several targets: a finding the output has for `target` that the input had not, about a module (or the dropped
    quantization config) that only another target's own repair changes, is the two targets wanting contradictory
    things: one line naming both. None when no other target's change explains it (then it is our bug)."""
    own = {d.target.spec: recipe_for_target(ckpt, d) for d in before}
    if len(own) < 2 or target not in own:
        return None
    mine = own.pop(target)
    for f in new:
        for other, recipe in own.items():
            changed = sorted(set(recipe.dequantize) - set(mine.dequantize))
            module = next((m for m in changed if _covered(f.subject, {m})), None)
            if module is None and recipe.drop_quantization and not mine.drop_quantization:
                module = "the quantization config"
            if module is not None:
                change = "dropping the quantization config" if module == "the quantization config" else f"dequantizing {module}"
                return BadInput(f"{ckpt.root}: no one output is clean for both {other} and {target}: {change}, which {other} needs, "
                                f"leaves {target} with [{f.code}] {f.message.split('; ')[0]}; nothing was written; fix for each target "
                                "separately (one --target each, into two outputs)")
    return None


def _unnameable(ckpt: Checkpoint, diagnosis: Diagnosis, left: list[Finding]) -> BadInput | None:
    """A layer the target builds quantized under the prefix "" (vLLM 0.32's Afmoe / ExaoneMoe lm_head: its model code
    passes no prefix), which no exclusion entry can name: only a quantized copy loads, and ModelOpt's NVFP4 one carries
    an activation scale calibrated on data, which no weight gives. One line saying so, never a plan that leaves it."""
    family = built_family(ckpt, diagnosis)
    name = next((f.subject for f in left if f.code == Kind.CONFIG_CONTRADICTION and family.runtime_name(f.subject) == ""), None)
    if name is None:
        return None
    target = diagnosis.target.spec
    return BadInput(f"{ckpt.root}: --target {target} cannot repair {name}: {target} builds it quantized under the prefix '' "
                    f"(its model code gives the layer no name), which no exclusion entry can reach, so only a quantized {name} "
                    f"loads, and the stored full-precision one cannot be requantized here: ModelOpt's NVFP4 layer needs an "
                    "activation scale (input_scale) calibrated on data, which no weight gives; nothing was written; re-export "
                    f"with {name} quantized, or fix for a target that reads its exclusion (--target bf16 drops the quantization)")


def cannot_repair(root: object, target: str, left: list[Finding]) -> BadInput:
    """The one line for findings a --target repair leaves (planning, and the writer's check of its output); a release
    that loads no checkpoint of the model is named first, as no repair of any other finding helps then."""
    left = sorted(left, key=lambda f: FIRST.index(f.code) if f.code in FIRST else len(FIRST))
    return BadInput(f"{root}: --target {target} cannot repair {len(left)} finding(s) doctor --strict reports for it "
                    f"([{left[0].code}] {left[0].message.split('; ')[0]}, ...), so its output would not pass; nothing was written; "
                    f"{_advice(left)}")


def _advice(left: list[Finding]) -> str:
    """What settles the findings left: the first one's alone when it refuses the model whole (nothing else helps
    then), else each kind's own, in order, so a user who follows it does not meet the next kind's refusal."""
    if left[0].code in FIRST:
        own = [r for r in OWN_REMEDIES.get(left[0].code, ()) if left[0].message.endswith(f"; {r}")]
        return own[0] if own else ADVICE[left[0].code]
    kinds = {f.code: ADVICE.get(f.code, DEFAULT_ADVICE) for f in left}  # in order, each kind once
    said = list(dict.fromkeys(kinds.values()))
    if len(said) == 1:
        return said[0]
    return "; ".join(f"for [{', '.join(k for k, a in kinds.items() if a == advice)}]: {advice}" for advice in said)
