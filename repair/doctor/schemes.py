"""What vLLM builds each stored layer as, for architectures without a loader profile.

Without a profile doctor cannot simulate the loader, but the config alone says which scheme vLLM 0.32
gives each layer (`targets/precision.py`: the declared algorithm, resolved as vLLM resolves it under
MIXED_PRECISION). That is the per-layer prediction `doctor --json` reports as `schemes`, and it finds
the one mismatch the config alone decides: a stored quantized layer that vLLM builds unquantized
because it has no linear method for its declared algorithm (NVFP4_AWQ under MIXED_PRECISION), whose
packed weight then fails to load.
"""

from __future__ import annotations

from repair.arch import Architecture
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration, routed_layer
from repair.formats.modules import FULL_PRECISIONS, StoredModule
from repair.targets.precision import built, declared_algorithm
from repair.targets.profiles import Target


def predicted_schemes(modules: dict[str, StoredModule], declaration: Declaration, family: Architecture,
                      target: Target) -> dict[str, str]:
    """Stored layer (a module with a 2-D or wider weight) -> the scheme the target vLLM builds it as ("bf16" when unquantized)."""
    if not target.profile.allows_quant_config:
        return {}
    out = {}
    for m in modules.values():
        weighted = m.tensor("weight") is not None or family.runtime_name(m.name) != m.name  # a 3-D experts tensor with no leaf
        if not weighted or len(m.logical_shape) < 2:
            continue  # norms and biases: no scheme to choose
        follows = target.profile.follows_draft_config and family.declared(m.name, declaration) == "quantized"
        out[m.name] = built(declared_algorithm(declaration, family, m.name)) if follows else "bf16"
    return out


def scheme_findings(modules: dict[str, StoredModule], schemes: dict[str, str], declaration: Declaration,
                    family: Architecture, target: Target) -> list[Finding]:
    """Stored quantized layers declared quantized that the target still builds unquantized."""
    if declaration.layer_algos is None:
        return []  # a single algorithm vLLM cannot build is refused while reading the config (declared.py)
    findings = []
    for name, scheme in schemes.items():
        m = modules[name]
        if scheme != "bf16" or not m.is_quantized or family.declared(name, declaration) != "quantized":
            continue
        algo = declared_algorithm(declaration, family, name)
        if m.algorithm != algo:
            continue  # stored as another algorithm: the algorithm-mismatch finding says so
        findings.append(Finding(
            Severity.ERROR, Kind.RUNTIME_SCHEME, name,
            f"{name}: declared {algo}, for which {target.spec} has no linear method: it builds the layer unquantized "
            f"and cannot load its {m.precision} weight; dequantize it (fix with a recipe rule "
            f"`algorithm = \"{algo}\"`, or fix --target bf16)"))
    return findings


def excluded_packed_findings(modules: dict[str, StoredModule], schemes: dict[str, str], declaration: Declaration,
                             family: Architecture, target: Target) -> list[Finding]:
    """Stored quantized layers the config excludes, under a target that follows the config: it builds them
    unquantized (a full-precision `weight` only), so their packed weight does not fit and their scales name
    parameters that do not exist; vLLM stops loading there (an excluded, packed EAGLE-3 lm_head, say)."""
    if not target.profile.follows_draft_config:
        return []
    out = []
    for name, scheme in schemes.items():
        m = modules[name]
        if scheme == "bf16" and m.is_quantized and family.declared(name, declaration) == "excluded":
            stored = "packed NVFP4" if m.precision == "nvfp4" else m.algorithm
            layer = routed_layer(family.runtime_name(name))
            how = "it" if layer == family.runtime_name(name) else (
                "its routed-experts layer (`...experts`, the one name the runtime asks about every expert of it)")
            out.append(Finding(Severity.ERROR, Kind.CONFIG_CONTRADICTION, name,
                               f"{name}: stored {stored}, but the config excludes {how}, so {target.spec} builds it unquantized "
                               f"and cannot load its {stored} tensors; dequantize it (fix --target does), or take it out "
                               "of the exclusions if it is meant to be quantized", repairs=(name,)))
    return out


def unloadable_full_precision_findings(modules: dict[str, StoredModule], schemes: dict[str, str],
                                      declaration: Declaration, family: Architecture, target: Target) -> list[Finding]:
    """Stored full-precision layers the target builds quantized: it allocates packed parameters, which the stored
    weight does not fit, and the load stops there. The config may list the layer's checkpoint name, yet the runtime
    matches exclusions on the prefix its layer hands the quant config (the profile's `prefixes`: GraniteMoe's 3-D
    `input_linear` loads into the FusedMoE layer `experts`; Afmoe builds lm_head with the prefix "")."""
    if not target.profile.follows_draft_config or not declaration.quantized:
        return []
    out = []
    for name, scheme in schemes.items():
        m = modules[name]
        if scheme == "bf16" or m.is_quantized or (m.precision not in FULL_PRECISIONS and m.tensor("weight") is not None):
            continue  # a float8 `weight` without a usable scale is fp8-scale's finding, not a full-precision layer
        asked = family.asked_name(name)  # a merged layer's shard: the layer's own name (StableLM's qkv_proj)
        where = "" if asked == name else f" (it matches exclusions on the prefix {asked!r} its layer is built with, not on {name!r})"
        todo = ("no exclusion entry can name an empty prefix: store it quantized" if not asked else
                f"exclude {asked!r}, the name the runtime matches, or store it quantized")
        what = (f"its loader casts the {m.precision} weight into the float8 parameter of the same shape and no tensor fills "
                "its block scales, so the layer computes garbage" if scheme == "fp8_block" else
                f"cannot load a {m.precision} weight into packed parameters")  # fp8_block: measured, vLLM 0.32 DeepSeek-V4
        out.append(Finding(Severity.ERROR, Kind.CONFIG_CONTRADICTION, name,
                           f"{name}: stored {m.precision}, but {target.spec} builds it {scheme}{where} and {what}; {todo}"))
    return out


def scheme_counts(schemes: dict[str, str]) -> str:
    """"12 nvfp4, 8 fp8, 3 bf16": how many layers the target builds in each scheme."""
    counts: dict[str, int] = {}
    for scheme in schemes.values():
        counts[scheme] = counts.get(scheme, 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
