"""A routed expert's gate and up (w1 and w3) stored with different weight_scale_2.

The runtime builds each expert's two as one w13 parameter and gives its kernel one global scale per expert; which one
is the release's data (`experts_gate_up_scale_2`: vLLM 0.28-0.32 keep the gate's, column 0, and log a warning once,
tools/vllm_expert_scales.py). The block scales stay as loaded, so the other half computes values off by the ratio,
silently. ModelOpt's export gives the pair one scale (formats/shared_scale.py), so a difference is a broken export or a
hand edit; dense fused layers are checks.py's (`family.scale_groups`, which leaves routed experts to this check).
Where a release's data does not say (SGLang, TensorRT-LLM: read, not yet data), the finding is a warning. SGLang 0.5.23
(modelopt_quant.py ModelOptNvFp4FusedMoEMethod) keeps the gate's on Marlin (same log) and on its single-alpha backends
(g1_alphas), both on flashinfer_trtllm; TensorRT-LLM @ 002366a4 (fused_moe/quantization.py
load_all_fp4_weight_scales_and_alphas) logs and takes the max, older code asserted "w1_weight_scale_2 != w3_weight_scale_2".
"""

from __future__ import annotations

from collections.abc import Mapping

from repair.doctor.findings import Finding, Kind, Severity

PAIRS = (("gate_proj", "up_proj"), ("w1", "w3"))  # (gate, up) leaf names under `experts.N.`
KEPT = {"gate": "the gate's (w1)", "up": "the up's (w3)"}


def experts_fact(target) -> Mapping[str, str]:
    """What the target release's data says it keeps: a rules file's own, else its vLLM profile's ({}: not recorded)."""
    rules = target.profile.rules
    if rules is not None:
        return rules.experts_gate_up_scale_2
    return target.release.experts_gate_up_scale_2 if target.release is not None else {}


def settled_by(subject: str, changed) -> bool:
    """The finding about expert `subject` goes when the plan changes both modules of its pair (requantizing one
    requantizes both with one shared scale: planning/modules.py fused_group)."""
    return any(f"{subject}.{gate}" in changed and f"{subject}.{up}" in changed for gate, up in PAIRS)


def expert_pairs(names) -> list[tuple[str, str]]:
    """(gate, up) module names of every routed expert (`...experts.N.`) that stores both, in name order."""
    out = []
    for name in sorted(names):
        parent, _, leaf = name.rpartition(".")
        owner, _, index = parent.rpartition(".")
        if not (index.isascii() and index.isdigit() and owner.rpartition(".")[2] == "experts"):
            continue
        for gate, up in PAIRS:
            if leaf == gate and f"{parent}.{up}" in names:
                out.append((name, f"{parent}.{up}"))
    return out


def expert_scale_findings(scale_2: Mapping[str, float], precision: Mapping[str, str], fact: Mapping[str, str],
                          who: str) -> list[Finding]:
    """An error per expert (the subject: `...experts.N`) whose gate and up, both built NVFP4, carry different weight_scale_2 (`scale_2`: the values
    doctor read; `fact`: what the target release keeps, empty where its data does not say: then a warning)."""
    out = []
    for gate, up in expert_pairs(scale_2):
        if scale_2[gate] == scale_2[up] or precision.get(gate) != "nvfp4" or precision.get(up) != "nvfp4":
            continue
        subject, leaves = gate.rpartition(".")[0], f"{gate.rpartition('.')[2]} and {up.rpartition('.')[2]}"
        kept = fact.get("keeps")
        if kept in KEPT:
            other = "up" if kept == "gate" else "gate"
            said = f" (it logs \"{fact['log']}\" once for the whole model)" if fact.get("log") else ""
            out.append(Finding(Severity.ERROR, Kind.EXPERTS_SCALE_2, subject,
                               f"{subject}: this routed expert's {leaves} (gate and up) have different weight_scale_2; "
                               f"{who} builds them as one w13 layer and keeps {KEPT[kept]} for both, without rescaling the block "
                               f"scales, and loads the model without an error{said}, so the {other} half computes values "
                               "off by the ratio of the two; ModelOpt exports the pair with one scale: requantize it with "
                               "--original (fix --requantize)"))
        else:
            out.append(Finding(Severity.WARNING, Kind.EXPERTS_SCALE_2, subject,
                               f"{subject}: this routed expert's {leaves} (gate and up) have different weight_scale_2; "
                               f"{who} builds them as one layer, and which scale it keeps is not recorded for this release; ModelOpt "
                               "exports the pair with one scale: requantize it with --original (fix --requantize)"))
    return out
