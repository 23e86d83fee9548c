"""Layers whose declared scheme the target release's scheme choice refuses while building the model.

A release picks a quantized layer's method from the layer's config group when it builds the layer: SGLang's
`CompressedTensorsConfig.get_moe_scheme` for a routed-experts layer (asked about its first expert), its
`_get_scheme_from_parts` for every other quantized layer (a Linear). Where the release has no scheme for the declared
algorithm, the build stops at the first such layer it meets, before any weight loads. The release data's
`moe_scheme_refused` and `linear_scheme_refused` (quant method -> {algorithm: the error and where}) say which: generated
by running the release's own predicates (tools/sglang_moe_schemes.py, tools/sglang_linear_schemes.py). SGLang
0.5.9-0.5.21 refuse a weight-only compressed-tensors NVFP4 MoE and Linear so; 0.5.9-0.5.16 every group of a config
whose top-level format is `mixed-precision` (facts `<algorithm> in mixed-precision`: they read only that format). A
fact's `built_by` lists the later releases, read from their wheels, that fall back to this file but build it (0.5.22).
"""

from __future__ import annotations

import re

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration, routed_layer
from repair.formats.ct_groups import MIXED_FORMAT
from repair.formats.modules import StoredModule
from repair.targets.precision import declared_algorithm
from repair.targets.profiles import Target
from repair.targets.runtime_rules import quant_method


def build_order(layer: str, fused: bool = False) -> tuple:
    """Where the model's constructor meets a layer: by decoder layer (one with no index, lm_head, after them), its
    attention before its MLP, the routed experts before the MLP's other layers, a layer fused from shards (qkv_proj,
    gate_up_proj) before the others of its part (SGLang's decoder layers build `self_attn` before `mlp`, their
    attention and MLP the fused input projection before the output one; its MoE blocks their experts first)."""
    index = re.search(r"\.(\d+)\.", layer + ".")
    part = 0 if "attn" in layer else 1 if layer.endswith(".experts") else 2
    return (0, int(index.group(1)), part, not fused, layer) if index else (1, 0, part, not fused, layer)


def built_layer(family: Architecture, name: str) -> tuple[str, bool]:
    """The layer the runtime builds `name` into (a shard's fused layer, a routed expert's experts layer), as it names
    it, and whether it is fused from shards."""
    parent, _, leaf = name.rpartition(".")
    fused = next((f"{parent}.{f}" for f, shards in family.fused_layers.items() if leaf in shards and ".experts." not in name), None)
    return routed_layer(family.runtime_name(fused or name)), fused is not None


def moe_scheme_findings(modules: dict[str, StoredModule], declaration: Declaration, family: Architecture,
                        target: Target) -> list[Finding]:
    """An error per routed-experts layer declared with an algorithm the release's MoE scheme choice refuses, and one for
    the first other layer its Linear scheme choice refuses, in the order the build meets them."""
    rules, method = target.profile.rules, quant_method(declaration) or ""
    moe = rules.moe_scheme_refused.get(method, {}) if rules is not None else {}
    linear = rules.linear_scheme_refused.get(method, {}) if rules is not None else {}
    asked, who = ".".join(map(str, target.version or ())), target.profile.speaker
    refused: dict[str, tuple[str, dict, bool]] = {}
    # a layer of a config group under compressed-tensors' top-level `mixed-precision`: its own facts (the releases that read
    # only the top-level format drop the group's input activations; tools/sglang_linear_schemes.py, sglang_moe_schemes.py)
    mixed = getattr(declaration.group_algos, "config_format", None) == MIXED_FORMAT
    for name in sorted(modules) if moe or linear else ():
        layer, fused = built_layer(family, name)
        facts = moe if ".experts." in name else linear
        if layer in refused or family.declared(name, declaration) != "quantized":
            continue
        algo = declared_algorithm(declaration, family, name)
        algo = f"{algo} in {MIXED_FORMAT}" if algo and mixed else algo
        fact = facts.get(algo or "")
        if fact is not None and asked not in fact.get("built_by", ()):
            refused[layer] = (algo, fact, fused)
    order = {layer: build_order(layer, fused) for layer, (_, _, fused) in refused.items()}
    linears = sorted((layer for layer in refused if not layer.endswith(".experts")), key=order.get)
    out = []
    for layer in sorted((*linears[:1], *(n for n in refused if n.endswith(".experts"))), key=order.get):
        algo, fact, _ = refused[layer]
        what = (f"its routed experts {algo}, and {who} has no MoE scheme for it" if layer.endswith(".experts") else
                f"it {algo} (so are {len(linears) - 1} other layers), and {who} has no Linear scheme for it")
        out.append(Finding(Severity.ERROR, Kind.QUANT_CONFIG, layer,
                           f"{layer}: the config declares {what} ({fact['where']}), so it refuses the model while building "
                           f"this layer, before any weight loads; dequantize the layers so declared (fix --target bf16), "
                           "or serve it with a release that builds it", fact["error"]))
    return out
