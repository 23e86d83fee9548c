"""What the target release does when config.json chooses between two builds of a model (the profile's `without`).

vLLM 0.32 builds Qwen4Exp's QSA attention only when the `indexer_*` fields are set (qwen4_exp/nvidia/model.py:243).
Left null, the build has no indexer, and its load_weights raises on a checkpoint that still stores one ("There is no
module or parameter named ..."); some set and some null, transformers' config class, which vLLM runs while reading
config.json, refuses the config before any layer is built ("QSA config is missing required fields"). Both facts are
recorded from vLLM's own code by the profile generator (tools/vllm_without_loads.py, tools/vllm_profile.py
partly_refused); each stops every rank, so each is one error, in the release's words where it recorded them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from repair.arch import Architecture
from repair.arch.profiled import pattern_regex
from repair.doctor.findings import Finding, Kind, Severity
from repair.targets.profiles import Target

LAYER_STAR = re.compile(r"(?<=\.)\*(?=\.|$)")
LAYER_NUMBER = re.compile(r"\.(\d+)(?=\.|$)")


def refused_config_findings(family: Architecture, target: Target, tp: int) -> list[Finding]:
    """One error when the release refuses config.json for its null fields of a build it reads together (only for the
    runtime whose code the row records: knows_layer_roles)."""
    refused = family.refused_config
    if refused is None or not target.profile.knows_layer_roles:
        return []
    null = ", ".join(refused.fields)
    words = f": {refused.error}" if refused.error else ""
    return [Finding(Severity.ERROR, Kind.CONFIG_REFUSED, null,
                    f"{null}: null in config.json while other fields of the same build are set; {refused.release} refuses "
                    f"such a config while reading it, before building any layer (its config class's validation, recorded in "
                    f"{refused.source}){words}; set every one of {', '.join(refused.together)}, or leave them all null",
                    refused.error, tuple(range(tp)))]


def unexpected_tensor_findings(names: Iterable[str], family: Architecture, target: Target, tp: int) -> list[Finding]:
    """One error per error text the release raises on the stored modules of the recorded patterns that its build for
    this config has no parameter for (QSA's indexer projection and norms: one `...self_attn.indexer` error): named by
    the first such module as names sort, with that module's layer numbers in the release's words."""
    if not family.refused_modules or not target.profile.knows_layer_roles:
        return []
    modules = sorted({n.rpartition(".")[0] for n in names})
    raised: dict[str, list[tuple[str, str]]] = {}
    for pattern, error, why in family.refused_modules:
        regex = re.compile(pattern_regex([pattern]))
        for module in (m for m in modules if regex.search(m)):
            numbers = iter(LAYER_NUMBER.findall(module))
            raised.setdefault(LAYER_STAR.sub(lambda _: next(numbers, "*"), error), []).append((module, why))
    out = []
    for said, hits in raised.items():
        (first, why), more = min(hits), f" (and {len(hits) - 1} more)" if len(hits) > 1 else ""
        out.append(Finding(Severity.ERROR, Kind.UNEXPECTED_TENSOR, first,
                           f"{first}{more}: stored, but {why}: it raises {said}; remove those modules' tensors, or set "
                           "those fields if the model was trained with the layers they configure", said, tuple(range(tp))))
    return sorted(out, key=lambda f: f.subject)
