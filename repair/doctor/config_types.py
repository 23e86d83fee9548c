"""A model_type the target release's config reader does not know: it refuses the model there, before anything else.

SGLang reads config.json through the transformers release it pins, after registering its own config classes (its
get_config); a model_type neither knows makes AutoConfig raise, so no registry, layer or weight is ever asked
(SGLang 0.5.9-0.5.11 and DeepSeek-V4: transformers 4.57.1-5.6.0 have no `deepseek_v4`, and those releases no config
class of their own). The rules file's `config_model_types` (tools/sglang_config_types.py, from the wheels) holds what
it knows; doctor then says the one refusal instead of judging a model that is never built. A config naming an
AutoConfig in its auto_map is read by remote code under --trust-remote-code: not judged here.
"""

from __future__ import annotations

from repair.arch.resolved import shown
from repair.doctor.findings import Finding, Kind, Severity
from repair.errors import one_line
from repair.targets.profiles import DATA_PROFILES, Target


def model_type_refusal(config: dict | None, target: Target, tp: int) -> Finding | None:
    """The release's refusal of config.json's model_type, in its words, on every rank; None where it reads it (or
    the file records nothing)."""
    rules = target.profile.rules
    fact = rules.config_model_types if rules is not None else {}
    model_type = (config or {}).get("model_type")
    auto_map = (config or {}).get("auto_map")
    if not fact or not isinstance(model_type, str) or model_type in fact["known"] or (
            isinstance(auto_map, dict) and "AutoConfig" in auto_map):
        return None
    if target.version is not None and target.version != rules.release:  # a later release read with this file pins
        return None  # its own transformers, which may know more (0.5.24+ read with 0.5.23's file)
    name = shown(model_type)  # hostile: cut, as every name a message repeats
    error = one_line(fact["error"].replace("{model_type}", name))
    readers = [p.rules.speaker for p in DATA_PROFILES if p.rules.runtime == rules.runtime
               and model_type in p.rules.config_model_types.get("known", ())]
    return Finding(Severity.ERROR, Kind.CONFIG_REFUSED, "model_type",
                   f"config.json's model_type `{name}`: {rules.speaker} reads config.json with transformers "
                   f"{fact['transformers']}, the release it pins, and its own config classes, and neither knows "
                   f"`{name}`, so it refuses the model while reading the config, before building anything (recorded in "
                   f"{rules.source}: {fact['where']}): {error.partition('. ')[0]}; no change to the weights helps: serve it "
                   f"with {' or '.join(readers) if readers else 'a release that knows it'}", error, tuple(range(tp)))
