"""A routed expert's gate and up (w1 and w3) stored with different global scales (weight_scale_2; compressed-tensors'
weight_global_scale, its inverse).

The runtime builds each expert's two as one w13 parameter and gives its kernel one global scale per expert; which one
is the release's data, per quant method (`experts_gate_up_scale_2`: vLLM 0.28-0.32 keep the gate's, column 0, and log
a warning once: ModelOpt's ModelOptNvFp4FusedMoE and compressed-tensors' CompressedTensorsW4A4Nvfp4MoEMethod, each in
its own words, tools/vllm_expert_scales.py). The block scales stay as loaded, so the other half computes values off by
the ratio, silently. ModelOpt's export gives the pair one scale (formats/shared_scale.py), so a difference is a broken
export or a hand edit; dense fused layers are checks.py's (`family.scale_groups`, which leaves routed experts to this check).
Where a release's data does not say (SGLang, TensorRT-LLM: read, not yet data), the finding is a warning. SGLang 0.5.23
(modelopt_quant.py ModelOptNvFp4FusedMoEMethod) keeps the gate's on Marlin (same log) and on its single-alpha backends
(g1_alphas), both on flashinfer_trtllm; TensorRT-LLM @ 002366a4 (fused_moe/quantization.py
load_all_fp4_weight_scales_and_alphas) logs and takes the max, older code asserted "w1_weight_scale_2 != w3_weight_scale_2".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from repair.doctor.findings import Finding, Kind, Severity
from repair.targets.precision import PACKED
from repair.targets.runtime_rules import quant_method

PAIRS = (("gate_proj", "up_proj"), ("w1", "w3"))  # (gate, up) leaf names under `experts.N.`
KEPT = {"gate": "the gate's (w1)", "up": "the up's (w3)"}
ALLCLOSE_RTOL, ALLCLOSE_ATOL = 1e-5, 1e-8  # torch.allclose defaults


@dataclass(frozen=True)
class ExpertsRule:
    """What the target keeps for the checkpoint's quant method (`keeps`/`log`: its data, empty where it does not say),
    the stored leaf of the global scale, and how the format repairs a pair (`repair`: the advice)."""
    keeps: str | None
    log: str | None
    leaf: str
    repair: str


def experts_fact(target, declaration) -> ExpertsRule:
    """The target release's data for the checkpoint's quant method (a rules file's own, else its vLLM profile's)."""
    rules = target.profile.rules
    facts = rules.experts_gate_up_scale_2 if rules is not None else \
        target.release.experts_gate_up_scale_2 if target.release is not None else {}
    fact = facts.get(quant_method(declaration) or "", {})
    fmt = declaration.format
    repair = ("re-export it, or dequantize the layer's routed experts together (a recipe; "
              f"{fmt.NAME} cannot be requantized)") if "requantize" in fmt.UNSUPPORTED else \
        "requantize it with --original (fix --requantize)"
    return ExpertsRule(fact.get("keeps"), fact.get("log"), fmt.LEAVES.get("weight_scale_2", "weight_scale_2"), repair)


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


def close(gate: float, up: float) -> bool:
    """torch.allclose(gate, up) at its defaults, the test vLLM 0.28-0.32 make before logging (modelopt.py:1025 in 0.32,
    compressed_tensors_moe_w4a4_nvfp4.py:205): within it the kept scale is off by at most 1e-5 relative, far below
    NVFP4's own error, so no runtime's choice matters there."""
    return abs(gate - up) <= ALLCLOSE_ATOL + ALLCLOSE_RTOL * abs(up)


def expert_scale_findings(scale_2: Mapping[str, float], precision: Mapping[str, str], rule: ExpertsRule | None,
                          who: str) -> list[Finding]:
    """An error per expert (the subject: `...experts.N`) whose gate and up, both built NVFP4 (W4A4 or weight-only W4A16:
    one MoE method, one column kept), carry different global
    scales (`scale_2`: the values doctor read; `rule`: what the target keeps, a warning where its data does not say)."""
    out = []
    for gate, up in expert_pairs(scale_2) if rule is not None else ():
        if close(scale_2[gate], scale_2[up]) or precision.get(gate) not in PACKED or precision.get(up) not in PACKED:
            continue
        subject, leaves = gate.rpartition(".")[0], f"{gate.rpartition('.')[2]} and {up.rpartition('.')[2]}"
        differ = f"{subject}: this routed expert's {leaves} (gate and up) have different {rule.leaf}; {who} builds them as one"
        export = f"ModelOpt exports the pair with one scale: {rule.repair}"
        if rule.keeps in KEPT:
            other = "up" if rule.keeps == "gate" else "gate"
            said = f" (it logs \"{rule.log}\" once for the whole model)" if rule.log else ""
            out.append(Finding(Severity.ERROR, Kind.EXPERTS_SCALE_2, subject,
                               f"{differ} w13 layer and keeps {KEPT[rule.keeps]} for both, without rescaling the block "
                               f"scales, and loads the model without an error{said}, so the {other} half computes values "
                               f"off by the ratio of the two; {export}"))
        else:
            out.append(Finding(Severity.WARNING, Kind.EXPERTS_SCALE_2, subject,
                               f"{differ} layer, and which scale it keeps is not recorded for this release; {export}"))
    return out
