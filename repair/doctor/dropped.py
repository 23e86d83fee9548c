"""Tensors the target's own load_weights takes and fills nothing with (the profile's `dropped`, from its code).

vLLM 0.32's laguna.py registers the routed experts' `e_score_correction_bias` on `mlp.experts.routed_experts` and
ignores `_bias` suffixes, so the published `mlp.experts.e_score_correction_bias` goes nowhere: the parameter keeps
its initial value (zeros) and the router runs without its correction bias, whatever the checkpoint says. On a
quantized checkpoint vLLM 0.32's weights check (off by default there: `--model-loader-extra-config
'{"enable_weights_track": true}'`) stops the load on it; 0.28's exempts the MoE layer's parameters, as 0.32's does
for an unquantized checkpoint (its default check).
No change to the files makes that release read the tensor, so it is an error fix cannot settle.
Tensors under a prefix the weight mapper drops (MiMo's `model.mtp_layers.`: the drafter's, never the main model's)
are never read at all: no check applies to them, and one note says so.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.targets.profiles import Target


def unread_tensors(infos: dict, family: Architecture, target: Target) -> tuple[dict, list[Finding]]:
    """(the tensors the target reads, one note per prefix its weight mapper drops that the checkpoint stores under)."""
    if not family.unread_prefixes or not target.profile.knows_layer_roles:
        return infos, []
    notes = []
    for prefix, why in family.unread_prefixes:
        hits = sorted(n for n in infos if n.startswith(prefix))
        if hits:
            notes.append(Finding(Severity.WARNING, Kind.IGNORED_TENSORS, prefix + "*",
                                 f"{len(hits)} tensor(s) under {prefix} ({hits[0]}, ...): {why}; no check applies to them"))
    kept = {n: i for n, i in infos.items() if not n.startswith(tuple(p for p, _ in family.unread_prefixes))}
    return kept, notes


def dropped_tensor_findings(names: Iterable[str], family: Architecture, target: Target, quantized: bool) -> list[Finding]:
    """One error per recorded dropped tensor the checkpoint stores (its first name; vLLM's error names every
    parameter left unfilled). Only for the runtime whose code the row records (knows_layer_roles). The recorded
    refusal holds for a quantized checkpoint only: on an unquantized one the check exempts the layer's parameters."""
    if not family.dropped_tensors or not target.profile.knows_layer_roles:
        return []
    names = sorted(names)
    out = []
    for dropped in family.dropped_tensors:
        hits = [n for n in names if re.fullmatch(dropped.regex, n)]  # `$` alone lets a trailing newline through
        if not hits:
            continue
        unfilled = [dropped.parameter_for(n) for n in hits]
        more = f" (and {len(hits) - 1} more of its name)" if len(hits) > 1 else ""
        refused = dropped.refused if quantized else None
        who = target.profile.speaker
        check = (f"{who} loads it so by default, and its weights check (--model-loader-extra-config "
                 "'{\"enable_weights_track\": true}') stops the load on it") if refused else f"{who}'s weights check lets it pass"
        out.append(Finding(Severity.ERROR, Kind.DROPPED_TENSOR, hits[0],
                           f"{hits[0]}{more}: {dropped.why}; {unfilled[0]} keeps its initial value, so the model runs "
                           f"without the stored values; {check}; no change to the files makes this release read it "
                           "(every checkpoint of this layout loses it): serve it with a release whose model code does",
                           f"{refused}: {{{', '.join(repr(u) for u in unfilled)}}}" if refused else None))
    return out
