"""Tensors the target's own load_weights takes and fills nothing with (the profile's `dropped`, from its code).

vLLM 0.32's laguna.py registers the routed experts' `e_score_correction_bias` on `mlp.experts.routed_experts` and
ignores `_bias` suffixes, so the published `mlp.experts.e_score_correction_bias` goes nowhere: the parameter keeps
its initial value (zeros) and the router runs without its correction bias, whatever the checkpoint says. vLLM's
weights check stops the load there in 0.32 (with the check on: default for unquantized checkpoints, else
`--model-loader-extra-config '{"enable_weights_track": true}'`); 0.28's exempts the quantized MoE layer's parameters.
No change to the files makes that release read the tensor, so it is an error fix cannot settle.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.targets.profiles import Target


def dropped_tensor_findings(names: Iterable[str], family: Architecture, target: Target) -> list[Finding]:
    """One error per recorded dropped tensor the checkpoint stores (its first name; vLLM's error names every
    parameter left unfilled). Only for the runtime whose code the row records (knows_layer_roles)."""
    if not family.dropped_tensors or not target.profile.knows_layer_roles:
        return []
    names = sorted(names)
    out = []
    for dropped in family.dropped_tensors:
        hits = [n for n in names if re.search(dropped.regex, n)]
        if not hits:
            continue
        unfilled = [dropped.parameter_for(n) for n in hits]
        more = f" (and {len(hits) - 1} more of its name)" if len(hits) > 1 else ""
        check = (f"{target.profile.speaker}'s weights check stops the load on it (always on for an unquantized "
                 "checkpoint, else with model_loader_extra_config enable_weights_track)") if dropped.refused else \
            f"{target.profile.speaker}'s weights check lets it pass"
        out.append(Finding(Severity.ERROR, Kind.DROPPED_TENSOR, hits[0],
                           f"{hits[0]}{more}: {dropped.why}; {unfilled[0]} keeps its initial value, so the model runs "
                           f"without the stored values; {check}; no change to the files makes this release read it "
                           "(every checkpoint of this layout loses it): serve it with a release whose model code does",
                           f"{dropped.refused}: {{{', '.join(repr(u) for u in unfilled)}}}" if dropped.refused else None))
    return out
