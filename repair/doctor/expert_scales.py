"""A routed expert's gate and up (w1 and w3) stored with different global scales (weight_scale_2; compressed-tensors'
weight_global_scale, its inverse).

The runtime builds each expert's two as one w13 parameter and gives its kernel one global scale per expert; which one
is the release's data, per quant method (`experts_gate_up_scale_2`: vLLM 0.28-0.32 keep the gate's, column 0, and log
a warning once: ModelOpt's ModelOptNvFp4FusedMoE and compressed-tensors' CompressedTensorsW4A4Nvfp4MoEMethod, each in
its own words, tools/vllm_expert_scales.py). The block scales stay as loaded, so the other half computes values off by
the ratio, silently. ModelOpt's export gives the pair one scale (formats/shared_scale.py), so a difference is a broken
export or a hand edit; dense fused layers are checks.py's (`family.scale_groups`, which leaves routed experts to this check).
Where what is kept depends on a choice the release makes at run time (SGLang 0.5.23: its MoE runner backend, picked by
GPU; compressed-tensors' scheme, picked by GPU), the data lists each choice (`backends`) and the release's default by
condition (`default`, tools/sglang_expert_scales.py): an error where a default keeps one scale or refuses the load,
naming the condition and the option value that keeps both; a built precision with its own scheme (0.5.23's weight-only
compressed-tensors MoE, which refuses any difference) has its own fact (`by_precision`). Where a release's data does not say (TensorRT-LLM: read,
not data; a compressed-tensors precision SGLang's data was not read for), the finding is a warning. TensorRT-LLM @
002366a4 (fused_moe/quantization.py load_all_fp4_weight_scales_and_alphas) logs and takes the max, older code asserted
"w1_weight_scale_2 != w3_weight_scale_2".
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
class Choice:
    """One way a release builds the experts (a MoE backend, a scheme): what it keeps ("gate", "up", "both"; None where
    it refuses the load, `refuses` its error), its log, whether it compares the pair exactly, and the condition under
    which the release picks it by default (`when`; None: only when asked for)."""
    name: str
    keeps: str | None
    log: str | None
    refuses: str | None
    exact: bool
    when: str | None


@dataclass(frozen=True)
class ExpertsRule:
    """What the target keeps for the checkpoint's quant method (`keeps`/`log`: its data, empty where it does not say;
    `choices`: where that depends on a run-time choice, `option` the flag that makes it), the stored leaf of the global
    scale, and how the format repairs a pair (`repair`: the advice); `precisions`: the built precisions the data was read
    for (empty: every packed one)."""
    keeps: str | None
    log: str | None
    leaf: str
    repair: str
    choices: tuple[Choice, ...] = ()
    option: str | None = None
    precisions: tuple[str, ...] = ()
    default_note: str | None = None  # what the data's default does not cover (SGLang: model-specific overrides)
    by_precision: tuple[tuple[str, ExpertsRule], ...] = ()  # another built precision's own rule (a weight-only scheme)

    def at(self, built: str | None) -> ExpertsRule:
        """The rule for experts built as `built`: its own where the data has one, else this."""
        return next((rule for name, rule in self.by_precision if name == built), self)


def experts_fact(target, declaration, architecture: str | None = None) -> ExpertsRule:
    """The target release's data for the checkpoint's quant method (a rules file's own, else its vLLM profile's), with
    the MoE backend overrides of `architecture` (the class the release builds) where its data has them."""
    rules = target.profile.rules
    overrides = rules.moe_backend_overrides.get(architecture or "", ()) if rules is not None else ()
    facts = rules.experts_gate_up_scale_2 if rules is not None else \
        target.release.experts_gate_up_scale_2 if target.release is not None else {}
    fmt = declaration.format
    repair = ("re-export it, or dequantize the layer's routed experts together (a recipe; "
              f"{fmt.NAME} cannot be requantized)") if "requantize" in fmt.UNSUPPORTED else \
        "requantize it with --original (fix --requantize)"
    return _rule(facts.get(quant_method(declaration) or "", {}), fmt.LEAVES.get("weight_scale_2", "weight_scale_2"), repair,
                 tuple((architecture, o) for o in overrides))


def _rule(fact, leaf: str, repair: str, overrides: tuple = ()) -> ExpertsRule:
    return ExpertsRule(fact.get("keeps"), fact.get("log"), leaf, repair, _choices(fact, overrides), fact.get("option"),
                       tuple(fact.get("precisions", ())), fact.get("default_note"),
                       tuple((p, _rule(f, leaf, repair)) for p, f in fact.get("by_precision", {}).items()))


def _choices(fact, overrides: tuple = ()) -> tuple[Choice, ...]:
    """The data's `backends`, each with its default condition from `default` (defaults first, in the data's order),
    after the model's own overrides of the backend (`overrides`: (architecture, {"backend", "when", "where"}), applied
    before the automatic choice; a backend the data has no entry for keeps "unrecorded")."""
    backends, default = fact.get("backends", {}), {d["backend"]: d["when"] for d in fact.get("default", ())}
    order = [*default, *(name for name in backends if name not in default)]
    own = tuple(_choice(o["backend"], backends.get(o["backend"], {"keeps": "unrecorded"}),
                        f"for {arch} where {o['when']} (its own server-arg override, {o['where']})")
                for arch, o in overrides) if backends else ()
    return own + tuple(_choice(name, backends[name], default.get(name)) for name in order if name in backends)


def _choice(name: str, backend: Mapping, when: str | None) -> Choice:
    return Choice(name, backend.get("keeps"), backend.get("log"), backend.get("refuses"), backend.get("test") == "exact",
                  when)


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
    out, base = [], rule
    for gate, up in expert_pairs(scale_2) if base is not None else ():
        rule = base.at(precision.get(gate))
        read = not rule.precisions or precision.get(gate) in rule.precisions  # the data was read for this precision
        exact = read and any(c.exact and c.when is not None for c in rule.choices)  # a default refusing any difference
        if (scale_2[gate] == scale_2[up] if exact else close(scale_2[gate], scale_2[up])) \
                or precision.get(gate) not in PACKED or precision.get(up) not in PACKED:
            continue
        subject, leaves = gate.rpartition(".")[0], f"{gate.rpartition('.')[2]} and {up.rpartition('.')[2]}"
        differ = f"{subject}: this routed expert's {leaves} (gate and up) have different {rule.leaf}; {who} builds them as one"
        export = f"ModelOpt exports the pair with one scale: {rule.repair}"
        if rule.choices and read:
            out.append(_by_choice(rule, subject, differ, export, close(scale_2[gate], scale_2[up])))
        elif rule.keeps in KEPT and read:
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


def _does(choice: Choice) -> str:
    if choice.refuses:
        return f"refuses to load the model ({choice.refuses})"
    if choice.keeps == "unrecorded":
        return "does with the pair what this release's data does not record for this quant method"
    if choice.keeps not in KEPT:
        return "keeps both"
    said = f" (it logs \"{choice.log}\" once for the whole model)" if choice.log else " and logs nothing"
    other = "up" if choice.keeps == "gate" else "gate"
    return (f"keeps {KEPT[choice.keeps]} for both without rescaling the block scales{said}, so the {other} half computes "
            "values off by the ratio of the two")


def _by_choice(rule: ExpertsRule, subject: str, differ: str, export: str, close_pair: bool) -> Finding:
    """The finding where what is kept depends on the release's run-time choice: each default by its condition, the
    choices that keep one scale otherwise, and the option value that keeps both; an error where a default is wrong
    (a pair within torch.allclose is wrong only for a choice that refuses any difference; every default is still named,
    so that one keeps its condition)."""
    defaults = [c for c in rule.choices if c.when is not None]
    harmless = {c.name for c in defaults if close_pair and c.keeps in KEPT}  # one scale kept, within allclose of both
    wrong = [c for c in defaults if c.keeps != "both" and c.name not in harmless]
    told = "; ".join(f"{c.name} {c.when}, which " + ("keeps one of the two, within torch.allclose of each other: harmless"
                                                     if c.name in harmless else _does(c)) for c in defaults)
    flag = f" ({rule.option} auto{'; ' + rule.default_note if rule.default_note else ''})" if rule.option else ""
    others = {k: [c.name for c in rule.choices if c.when is None and c.keeps == k] for k in KEPT}
    also = "".join(f"; asked for, {' and '.join(names)} keep{'s' if len(names) == 1 else ''} {KEPT[k]} too"
                   for k, names in others.items() if names)
    both = list(dict.fromkeys(c.name for c in rule.choices if c.keeps == "both"))
    fix = f"; {rule.option} {' or '.join(both)} keeps both where it runs" if rule.option and both else ""
    return Finding(Severity.ERROR if wrong else Severity.WARNING, Kind.EXPERTS_SCALE_2, subject,
                   f"{differ} w13 layer, and by default{flag} it uses {told}{also}{fix}; {export}")
