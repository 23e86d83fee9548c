"""A per-layer config.json list holding a value the target release does not build: it refuses the model, before any weight.

SGLang 0.5.23 builds DeepSeek-V4's attention by its layer's entry of `compress_ratios` and refuses any other value, or a
list shorter than the decoder (its data's `layer_values_refused`, learned from its own build by
tools/sglang_layer_values.py): model_type `deepseek_v41` is read by SGLang's own config class and refused by the
attention's assert; `deepseek_v4` already by the config class of the transformers it pins, which maps every entry,
past the decoder too. A hostile list used to drop nothing and leave ~10 missing modules said instead; doctor now says
the one refusal and nothing else. Only what the probes prove is claimed: an entry that is a whole number (not a bool) or
a string, equal to none the release builds; another kind of entry (a float, a list, null) is not judged.
"""

from __future__ import annotations

from repair.arch.layer_rules import MOST_LAYERS, decoder_depth, text_part
from repair.arch.resolved import Resolved, shown
from repair.doctor.findings import Finding, Kind, Severity
from repair.errors import one_line
from repair.targets.profiles import Target


def layer_value_refusal(config: dict | None, target: Target, resolved: Resolved, tp: int) -> Finding | None:
    """The release's refusal of the class it builds for this config, where a per-layer list holds what it refuses."""
    rules = target.profile.rules
    fact = rules.layer_values_refused.get(resolved.name or "") if rules is not None else None
    model_type = (config or {}).get("model_type") if isinstance(config, dict) else None
    if not isinstance(fact, dict) or target.version is not None and target.version != rules.release:
        return None  # a later release read with this file may build more
    said = fact["by_model_type"].get(model_type) if isinstance(model_type, str) else None
    entries, depth = text_part(config).get(fact["field"]), decoder_depth(config)
    if said is None or not isinstance(entries, list) or not depth or len(entries) > MOST_LAYERS:
        return None
    error = _refused(entries if said["past_depth"] else entries[:depth], said)
    if error is None and len(entries) < depth and "short" in said:
        error = said["short"]["error"].replace("{length}", str(len(entries))).replace("{depth}", str(depth)), said["short"]["where"]
    if error is None:
        return None
    words, where = one_line(error[0]), error[1]
    return Finding(Severity.ERROR, Kind.BUILD_REFUSED, fact["field"],
                   f"config.json's `{fact['field']}` (model_type `{shown(model_type)}`, {len(entries)} entries for "
                   f"{depth} decoder layers): {rules.speaker} builds {resolved.name} only from entries "
                   f"{', '.join(map(str, said['accepts']))}, one per decoder layer, and refuses this config before "
                   f"loading any weight (learned from its own build, recorded in {rules.source}: {where}): {words}; no "
                   f"change to the weights helps: write the list the model was trained with into config.json", words,
                   tuple(range(tp)))


def _refused(entries: list, said: dict) -> tuple[str, str] | None:
    """(its words, where) for the first entry the release refuses, or None: a whole number or string equal to none it
    builds (other kinds are not probed)."""
    accepts, template = said["accepts"], said["refused"]
    for value in entries:
        if (type(value) is int or type(value) is str) and not any(type(value) is type(a) and value == a for a in accepts):
            text = (repr if template["shown"] == "repr" else str)(value)
            return template["error"].replace("{value}", shown(text)), template["where"]
    return None
