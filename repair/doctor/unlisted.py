"""config.json listing no architectures (absent, null or []), as the target release reads it (the profile's `unlisted`).

vLLM 0.28-0.32's get_config names the class from model_type, by the transformers beside it (transformers_utils/config.py:
`MODEL_MAPPING_NAMES[model_type]`, a base model: dbrx -> DbrxModel), and its registry builds that as a pooling model
(DbrxForCausalLM converted to an embedding model: it loads, and serves no text generation); a model_type mapped to no
class leaves the list empty, which its registry refuses while the config is validated ("No model architectures are
specified", registry.py `inspect_model_cls`). tools/vllm_registry.py records both from vLLM's own code.
"""

from __future__ import annotations

from repair import arch
from repair.arch.registry import Builds, shown
from repair.doctor.findings import Finding, Kind, Severity
from repair.doctor.refused_load import refused_at_or_after
from repair.targets.profiles import Target


def unlisted_findings(target: Target, builds: Builds, config: dict | None, tp: int) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes) for a config.json that lists no architectures: an error in the release's words where it
    refuses it (a note where no profiled release at or after the target's says so), a warning where it builds a
    pooling model, a note where it names a class to generate with; nothing where a hand row claims the model_type
    (the Gemma 4 assistant: vLLM loads it as a draft) or the release's reading is not recorded."""
    registry = target.registry
    listed = isinstance(config, dict) and config.get("architectures") not in (None, [])
    if registry is None or registry.unlisted_refused is None or listed or any(a.claims(config) for a in arch.ARCHITECTURES):
        return [], []
    resolved, who, source = target.built(builds), registry.label, registry.source
    model_type = shown(str((config or {}).get("model_type")))
    if resolved.error is not None and resolved.backend != "remote code":
        named = (f"names no class from its model_type {model_type!r} (the transformers beside it maps it to none"
                 if resolved.derived is None else f"names transformers' base model {resolved.derived} from its model_type "
                 f"{model_type!r}, of which it builds no class (its registry")
        said = (f"config.json lists no architectures, and {who} {named}; recorded in {source}), so it refuses the model "
                f"while reading the config: {resolved.error}; list the model's class in `architectures`")
        if not refused_at_or_after(target, builds):
            return [], [Finding(Severity.WARNING, Kind.UNREGISTERED, "architectures", f"{said} (no profiled release at or "
                                f"after {target.spec} says so, and a later one may build it: check {target.spec})")]
        return [Finding(Severity.ERROR, Kind.UNREGISTERED, "architectures", said, resolved.error, tuple(range(tp)))], []
    built = resolved.name or resolved.derived
    how = f"transformers' base model {resolved.derived}" + (f", built as {built}" if built != resolved.derived else "") + (
        " through its Transformers backend" if resolved.backend else "")
    named = (f"config.json lists no architectures, so {who} names the class from model_type {model_type!r} (its "
             f"get_config, recorded in {source}): {how}")
    if resolved.runner != "pooling":
        return [], [Finding(Severity.WARNING, Kind.UNREGISTERED, "architectures", named)]
    listing = registry.generative(built)
    return [Finding(Severity.WARNING, Kind.UNREGISTERED, "architectures",
                    f"{named}, as a pooling (embedding) model, which serves no text generation; list the model's class "
                    f"in `architectures`" + (f', e.g. ["{listing}"]' if listing else ""))], []
