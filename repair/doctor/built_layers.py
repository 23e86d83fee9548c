"""Layers the target runtime builds under its own names, asked as its constructor asks them (#28).

A runtime's model class may name its layers otherwise than the checkpoint does (SGLang's DeepSeek-V4:
`model.layers.N.self_attn.wqkv_a` for the checkpoint's `layers.N.attn.wq_a`); its constructor asks the quant config
about each layer under its own name, and a config whose targets name no such layer stops the build. The release data's
`built_layers` (generated from the runtime's own model code: tools/sglang_built_layers.py) lists those names per
architecture, `*` standing for a layer number; each is asked for every layer the config.json declares. Every
pattern is asked at every layer number, so a sublayer some layers lack (DeepSeek-V4's compressor) is asked at all.
"""

from __future__ import annotations

from repair.arch.registry import Resolved
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration
from repair.targets.profiles import Target

MAX_LAYERS = 4096  # a hostile num_hidden_layers must not make doctor ask millions of names


def built_names(patterns: list[str], layers: int) -> list[tuple[str, str]]:
    """(pattern, the runtime's layer name) in its construction order: layer-wide patterns where they stand (before
    or after the numbered layers), the numbered ones layer by layer."""
    first = next((i for i, p in enumerate(patterns) if "*" in p), len(patterns))
    numbered = [p for p in patterns if "*" in p]
    return ([(p, p) for p in patterns[:first] if "*" not in p]
            + [(p, p.replace("*", str(n))) for n in range(layers) for p in numbered]
            + [(p, p) for p in patterns[first:] if "*" not in p])


def _layer_count(config: dict | None) -> int:
    value = (config or {}).get("num_hidden_layers")
    return min(value, MAX_LAYERS) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def built_layer_findings(declaration: Declaration, target: Target, config: dict | None, built: Resolved) -> list[Finding]:
    """One error per built layer pattern the config gives no way to build (at the first layer number refused), in
    the runtime's words; the first is where the build stops. `built`: the listed class the target builds."""
    rules = target.profile.rules
    name = built.name
    built = rules.built_layers.get(name) if rules is not None and name is not None else None
    if not built or not declaration.quantized:
        return []
    who, rule, out, said = target.profile.speaker, declaration.rule(), [], set()
    for pattern, layer in built_names(list(built), _layer_count(config)):
        if pattern in said:
            continue
        asked = f"{layer}.0.gate_proj" if built[pattern] == "FusedMoE" else layer  # get_moe_scheme asks the first expert
        error = declaration.format.fused_refusal(asked, (), rule)
        if error is None:
            continue
        said.add(pattern)
        out.append(Finding(Severity.ERROR, Kind.QUANT_CONFIG, layer,
                           f"{layer}: {who} builds this {built[pattern]} under its own name (not the checkpoint's), and "
                           f"the config gives that name no scheme, so {who} refuses the model while building it; name "
                           f"{who}'s layers in the config's targets or ignore list", error))
    return out
