"""Linears a target release refuses to build because a compressed-tensors `sparsity_config` makes them 2:4 sparse.

SGLang's `CompressedTensorsConfig.get_linear_scheme` (every release 0.5.9-0.5.23) matches each Linear against the
sparsity config's targets and raises while building it where its own `supports_cutlass_24` holds for the layer's
scheme: an unquantized layer or an 8-bit per-tensor one under a 2:4 structure, in the formats that check admits. The
release data's `sparse_24_refused` (tools/sglang_sparse24.py: the release's function compiled and asked) says for which
schemes; the build stops at the first such layer it meets (doctor/moe_schemes.py `build_order`), before any weight loads.
vLLM 0.28-0.32 go no further than reading the config: a sparsity_config whose targets name anything is refused there
(the release's `ct_sparsity_refused`, tools/vllm_ct_sparsity.py: its own `_parse_sparsity_config` asked).
"""

from __future__ import annotations

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.doctor.missing import own_loader
from repair.doctor.moe_schemes import build_order, built_layer
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule
from repair.targets.precision import declared_algorithm
from repair.targets.profiles import Target
from repair.targets.runtime_rules import quant_method


def sparse_24_findings(modules: dict[str, StoredModule], declaration: Declaration, family: Architecture,
                       target: Target) -> list[Finding]:
    """One error for the first Linear (in build order) the sparsity config targets whose scheme the release refuses;
    one for the config where the release refuses it while reading it."""
    rules, sparsity = target.profile.rules, declaration.sparsity
    release = own_loader(target)
    read = release.ct_sparsity_refused if release is not None and sparsity is not None and sparsity.targeted else {}
    if read:
        return [_refused_while_read(sparsity, read, f"{target.profile.speaker} {'.'.join(map(str, release.release))}")]
    fact = rules.sparse_24_refused.get(quant_method(declaration) or "", {}) if rules is not None and sparsity else {}
    refused = set(fact.get("refused", {}).get(sparsity.format, ())) if fact and sparsity.structure == "2:4" else set()
    hits: dict[str, tuple[str, bool]] = {}
    for name in sorted(modules) if refused else ():
        declared = family.declared(name, declaration)
        if ".experts." in name or declared == "-":
            continue
        layer, fused = built_layer(family, name)
        scheme = (declared_algorithm(declaration, family, name) or "BF16") if declared == "quantized" else "BF16"
        if layer not in hits and scheme in refused and sparsity.covers(layer, family.fused_layers):
            hits[layer] = (scheme, fused)
    if not hits:
        return []
    layer = min(hits, key=lambda n: build_order(n, hits[n][1]))
    scheme, _ = hits[layer]
    built = "unquantized" if scheme == "BF16" else scheme
    advice = ("its weights are stored dense, so without the sparsity_config it builds them as dense layers"
              if sparsity.format == "dense" else "serve it with a runtime that has a kernel for it")
    return [Finding(Severity.ERROR, Kind.QUANT_CONFIG, layer,
                    f"{layer}: the config's sparsity_config makes this {built} layer {sparsity.structure} sparse "
                    f"({sparsity.format}), and {target.profile.speaker} has no kernel for it ({fact['where']}; "
                    f"{len(hits) - 1} other layers alike), so it refuses the model while building this layer, before "
                    f"any weight loads; {advice}", fact["error"])]


def _refused_while_read(sparsity, fact: dict, speaker: str) -> Finding:
    where = "quantization_config.sparsity_config"
    advice = ("its weights are stored dense, so without the sparsity_config the layers load as they are declared; "
              "remove it from config.json" if sparsity.format == "dense" else
              "its weights are stored compressed (sparse), so serve it with a runtime that reads them")
    return Finding(Severity.ERROR, Kind.QUANT_CONFIG, where,
                   f"{where} names targets ({sparsity.structure} sparse, {sparsity.format}), and {speaker} refuses any "
                   f"sparsity config that does while reading the config, before building any layer ({fact['where']}); "
                   f"{advice}", fact["error"])
