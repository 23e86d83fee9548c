"""An architecture the target release loads no checkpoint of, whatever its quantization (the profile's `load_refused`).

vLLM 0.28 to 0.32 raise in the model class's own load_weights on every checkpoint of DBRX (dbrx.py looks the fused
experts up as `blocks.N.ffn.experts.w13_weight`, a name its FusedMoE no longer has: `KeyError`, vllm-project/vllm#49004)
and of OLMo Hybrid (olmo_hybrid.py's conv1d loader indexes with a shard id it never receives: `TypeError`,
vllm-project/vllm#55858). The generator records the error from vLLM's own load of transformers' BF16 checkpoint
(tools/vllm_load_refused.py). No change to the files settles it, so it is one error for the whole checkpoint, quoted
in vLLM's words, and `fix` refuses it in one line.
"""

from __future__ import annotations

from repair import arch
from repair.arch import Architecture
from repair.arch.profiled import load_refusal_holds, refusal_holds, releases_loading
from repair.arch.layer_rules import decoder_depth, text_part
from repair.arch.registry import Builds, Registry, shown
from repair.doctor.findings import Finding, Kind, Severity
from repair.targets.profiles import DATA_PROFILES, Target


def load_refused_findings(family: Architecture, target: Target, name: str, tp: int) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes): one error when the target's release loads no checkpoint of architecture `name` (only for the
    runtime whose code the row records: knows_layer_roles); a note instead when no profiled release at or after the
    target's records it (a later release may have fixed its loader); nothing for a release older than every shipped
    profile (its rows are the oldest profile's, and a load failure may be that release's regression)."""
    refused = family.load_refused
    older = target.version is not None and target.release is not None and target.release.release > target.version
    if refused is None or not target.profile.knows_layer_roles or older:
        return [], []
    said = (f"{name}: {refused.release}'s load_weights fails on every checkpoint of this architecture, whatever its "
            f"quantization: its own loader raises {refused.error} on transformers' BF16 checkpoint of it (recorded in "
            f"{refused.source})")
    if not load_refusal_holds(arch.PROFILES, target.profile.runtime, target.version, name):
        return [], [Finding(Severity.WARNING, Kind.LOAD_REFUSED, name,
                            f"{said}; no profiled release at or after {target.spec} records this, and a later release may "
                            f"have fixed its loader: check that {target.spec} loads it, or {advice(target.profile.runtime, name)}")]
    return [Finding(Severity.ERROR, Kind.LOAD_REFUSED, name,
                    f"{said}; no change to the files makes this release load it: {advice(target.profile.runtime, name)}",
                    refused.error, tuple(range(tp)))], []


def build_refused_findings(target: Target, name: str, config: dict | None, tp: int) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes): one error when the target's release records that its own model code refuses to build
    architecture `name` from the config transformers writes for it (the profile's `build_refused`: vLLM 0.30's
    qwen4_exp/nvidia/model.py:237 raises on the `indexed_attention` layer type), where config.json holds what it refuses
    (its `when`: the field, in the text part, whose value it quotes; published Qwen4Exp configs write `full_attention`);
    a note when no profiled release at or after the target records it (a later release may build it), as for
    `load_refused`. A host that could not build it (a GPU-only kernel, `unprofiled` alone) says nothing: nothing."""
    release = target.release
    older = target.version is not None and release is not None and release.release > target.version
    refused = release.build_refused.get(name) if release is not None and not older else None
    if not isinstance(refused, dict) or not target.profile.knows_layer_roles or not holds(refused.get("when"), config):
        return [], []
    error, runtime = str(refused.get("error")), target.profile.runtime
    building = [p.label for p in arch.PROFILES if p.runtime == runtime and name in p.entries]
    where = f"serve it with {' or '.join(building)}, which builds it" if building else "serve it with another runtime"
    when = refused.get("when")
    what = f"config.json's {when['field']} holds {when['holds']!r}, as transformers writes it, and " if isinstance(when, dict) else ""
    said = (f"{name}: {what}{release.label} refuses to build this architecture from such a config, on every rank, before "
            f"loading any weight: its own model code raises {error} ({refused.get('raised_at')}) on "
            f"{'it' if what else 'the config transformers writes for it'} (recorded in {release.source})")
    if not refusal_holds(arch.PROFILES, runtime, target.version, lambda p: name in p.build_refused):
        return [], [Finding(Severity.WARNING, Kind.BUILD_REFUSED, name,
                            f"{said}; no profiled release at or after {target.spec} records this, and a later release may "
                            f"build it: check that {target.spec} does, or {where}")]
    fix = (f"write {when['field']} as the model's original config.json does (the release builds the config without it)"
           if isinstance(when, dict) else "no change to the files makes this release build it")
    return [Finding(Severity.ERROR, Kind.BUILD_REFUSED, name, f"{said}; {fix}, or {where}", error, tuple(range(tp)))], []


def holds(when, config: dict | None) -> bool:
    """Whether config.json holds what the release refuses (`when`: {"field", "holds"}) where its build reads it: the
    text part's field a list holding that value for one of the layers built (vLLM 0.30 builds layer i with
    `layer_types[i]`, i below num_hidden_layers: qwen4_exp/nvidia/model.py:396-406). A bare string, or the value past
    the last layer, never reaches the build (its config reading refuses those, in other words); no `when`: every config."""
    if not isinstance(when, dict):
        return True
    value = text_part(config).get(when.get("field")) if isinstance(when.get("field"), str) else None
    built = value[:decoder_depth(config) or len(value)] if isinstance(value, list) else []
    return when.get("holds") in built


def advice(runtime: str, name: str) -> str:
    """What to do: the shipped releases whose own load takes it, else a release past the profiled ones."""
    loading = releases_loading(arch.PROFILES, runtime, name)
    if loading:
        return f"serve it with {' or '.join(loading)}, whose own load takes it (its profile records no such failure)"
    checked = [p.label for p in arch.PROFILES if p.runtime == runtime and p.load_checked]
    return (f"serve it with a release whose model code is fixed (none of the profiled {', '.join(checked)} loads it: "
            "look this error up in the runtime's issues for the release that fixes it) or with another runtime")


def registry_findings(target: Target, builds: Builds, config: dict | None, tp: int) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes) on which class the target's release builds for config.json's `architectures`
    (arch/registry.py): one error, in its own words, when it builds none (it refuses the model while reading the
    config, on every rank); a note when it falls back to its Transformers backend, whose layers no profile row
    describes. None for a checkpoint a hand row claims by model_type (the Gemma 4 assistant: vLLM loads it as a draft
    under another name). `builds`: config.json's `architectures` as every shipped release reads it (read_builds)."""
    resolved, registry = target.built(builds), target.registry
    if registry is None or any(a.claims(config) for a in arch.ARCHITECTURES):
        return [], []
    listed, source = builds.listed, registry.source
    names = ", ".join(shown(a) for a in listed[:4]) + (f" (and {len(listed) - 4} more)" if len(listed) > 4 else "")
    who = registry.label
    if resolved.malformed:
        return [Finding(Severity.ERROR, Kind.UNREGISTERED, "architectures",
                        f"config.json's `architectures` is not a list of class names, which {who} refuses while validating "
                        f"the config (recorded in {source}): {resolved.error}; write it as a list of the model's class "
                        'names, e.g. ["LlamaForCausalLM"]', resolved.error, tuple(range(tp)))], []
    if not listed:  # nothing listed: the class named from model_type (doctor/unlisted.py)
        return [], []
    if resolved.error is not None and not resolved.backend:
        serving = [p.label for p in arch.PROFILES if p.registry is not None and builds.of(p.registry).error is None]
        where = f"serve it with {' or '.join(serving)}, which build one" if serving else "serve it with another runtime"
        if not refused_at_or_after(target, builds):
            return [], [Finding(Severity.WARNING, Kind.UNREGISTERED, names or "architectures",
                                f"{names or 'config.json'}: {who}, the newest profiled release at or below {target.spec}, "
                                f"has no model class of {_asked(registry)} (its registry, recorded in "
                                f"{source}) and refuses the model: {resolved.error}; registries grow with every release "
                                f"and no profiled release at or after {target.spec} says the same, so check that "
                                f"{target.spec} registers it, or {where}")]
        return [Finding(Severity.ERROR, Kind.UNREGISTERED, names or "architectures",
                        f"{names or 'config.json'}: {who} has no model class of {_asked(registry)} (its "
                        f"registry, recorded in {source}), {_backend_refuses(registry)}: {resolved.error}; list the model's class as {who} "
                        f"registers it {'first ' if registry.first else ''}in config.json's `architectures`, or {where}",
                        resolved.error, tuple(range(tp)))], []
    if resolved.backend == "remote code":
        return [], [Finding(Severity.WARNING, Kind.UNREGISTERED, names,
                            f"{names}: {who} has no model class of any listed architecture (its registry, recorded in "
                            f"{source}); served with --trust-remote-code it builds the class config.json's auto_map names "
                            "through its Transformers backend, whose layers the profile's rows do not describe (doctor "
                            f"checks them as a generic model's); without that flag it refuses: {resolved.error}")]
    if resolved.backend == "auto_map":
        return [], [Finding(Severity.WARNING, Kind.UNREGISTERED, names,
                            f"{names}: neither {who}'s registry (recorded in {source}) nor transformers has a model class "
                            "of this name, so its Transformers backend imports the module config.json's auto_map names "
                            "as AutoModel, running that code even without --trust-remote-code (its gate never asks that "
                            "flag), and builds it if that class is backend-compatible, with layers "
                            "the profile's rows do not describe (doctor checks them as a generic model's); if that code "
                            f"does not load it refuses: {resolved.error}")]
    if resolved.backend:
        return [], [Finding(Severity.WARNING, Kind.UNREGISTERED, resolved.name,
                            f"{resolved.name}: {who} has no model class of its own for any listed architecture "
                            f"(its registry, recorded in {source}); transformers has a class of that name, so its "
                            f"Transformers backend (model_impl=\"auto\") takes the model and builds what transformers' "
                            "AutoModel makes of config.json (its model_type), not that class; the profile's layer rows do not "
                            "describe that backend, so doctor checks this model's layers as a generic one's")]
    return [], []


def _asked(registry: Registry) -> str:
    """Which listed names the release asks its registry about: the first only (its `registry_rule`), else each."""
    return "the first architecture config.json lists (it asks no other)" if registry.first else \
        "any architecture config.json lists"


def _backend_refuses(registry: Registry) -> str:
    """How the release came to refuse: with no Transformers fallback (TensorRT-LLM's first-name rule) its model
    factory raises before building any layer; the recorded gate asks every listed name (SGLang's, before any layer is
    built); vLLM's asks about the first one while reading the config."""
    if registry.first is not None:
        return "and it has no Transformers fallback, so building the model raises before any layer is built"
    if registry.backend is not None and registry.backend.asks_each:
        return ("and its Transformers backend, which asks about every listed name in order, refuses one, so it refuses the "
                "model before building any layer")
    return "nor does its Transformers backend take the first one, so it refuses the model while reading the config"


def refused_at_or_after(target: Target, builds: Builds) -> bool:
    """Whether a profiled release of the target's runtime at or after the target's own refuses the listed names too.
    A class is added in some release and stays (retired names aside, which carry their own message), so a refusal
    by the release itself or a later one holds for the target; a refusal by an earlier one alone may not."""
    runtime, version, registry = target.profile.runtime, target.version, target.registry
    if version is None or (registry is not None and not registry.retired.keys().isdisjoint(builds.listed)):
        return True  # a retired name (vLLM's own "was supported until", or a plugin's) does not come back
    later = [p.registry for p in arch.PROFILES if p.runtime == runtime and p.release >= version] + \
        [p.rules.model_registry for p in DATA_PROFILES if p.runtime == runtime and p.rules.release >= version]  # rules files
    return any(r is not None and builds.of(r).error is not None for r in later)
