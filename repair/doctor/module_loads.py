"""Module-driven loaders (a release whose data says `loaders.model: copy_weight`, TensorRT-LLM's PyTorch workflow):
each built module pulls the tensors under its own name; what no module asks for is never read.

Rank by rank, from the release's data (`rules.loaders`, `rules.draft`; provenance: tests/data/trtllm/PROVENANCE.md):
a stored weight is sliced by its own width and copied into the parameter the release builds (repair/targets/
copy_weight.py): another dtype is cast silently (an error here: a float8 weight copied without its scale computes
garbage), another shape is torch's broadcast error; fused shards are concatenated first; NVFP4 fused shards must
share input_scale and weight_scale_2 (asserted); an MTP layer `model.layers.<N+i>` is unquantized only when the
list excludes that name; a layer built unquantized whose model loader still reads scales fails on `weight_scale`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from repair.arch.registry import Resolved
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule
from repair.io.checkpoint import Checkpoint
from repair.targets import copy_weight
from repair.targets.tp_rules import MAX_DEGREE
from repair.targets.profiles import Target
from repair.targets.sglang_match import Building
from repair.targets.trtllm_match import trtllm_building
from repair.targets.vllm_loader import Outcome

SCALE_ROLES = ("weight_scale", "weight_scale_2", "input_scale")
# the generic checks' account of fused layers and of the schemes built (worded for vLLM's loaders and its linear
# methods); this loader's own replaces them (and the missing activation scale, its own error or dynamic quantization)
REPLACED_BY_LOADS = frozenset({Kind.FUSED_SHARDS, Kind.SIBLINGS_SCALE_2, Kind.MISSING_INPUT_SCALE, Kind.RUNTIME_SCHEME})


def replaced_by_loads(f: Finding) -> bool:
    """A generic finding this loader's account replaces (an excluded packed layer's error is its copy_weight error)."""
    return f.code in REPLACED_BY_LOADS or (f.code == Kind.CONFIG_CONTRADICTION and f.severity == Severity.ERROR)
EXPERT = re.compile(r"\.experts\.\d+\.")  # a MoE's experts load through its own method, not NVFP4LinearMethod


@dataclass(frozen=True)
class Layer:
    """One layer the release builds: its runtime name, the stored modules it pulls (shards in order), its scheme."""

    name: str
    shards: tuple[str, ...]  # checkpoint module names; "" where a fused shard is not stored
    scheme: str  # "nvfp4", "fp8", "bf16", ...
    leaf: str  # the fused leaf (qkv_proj, gate_up_proj) or ""
    why: str  # how the release decided the scheme, for messages


def module_driven(target: Target) -> bool:
    """The release's data says its loader is module-driven (`loaders.model: copy_weight`)."""
    return target.profile.rules is not None and target.profile.rules.loaders.get("model") == "copy_weight"


def module_load_findings(ckpt: Checkpoint, modules: dict[str, StoredModule], declaration: Declaration,
                         target: Target, tp: int, family, read, built: Resolved) -> tuple[list[Finding], dict[str, str]]:
    """(findings, the scheme the release builds each stored linear as) for a module-driven release; `read(path, info)`
    gives a stored scalar's bytes (doctor's ScaleValues: local files or the Hub's mirror)."""
    loaders, rules = target.profile.rules.loaders, target.profile.rules
    if tp > MAX_DEGREE:  # each rank is simulated: a hostile --tp must not make doctor loop (or list) a billion ranks
        return [Finding(Severity.ERROR, Kind.TP_IMPOSSIBLE, "--tp", f"tensor parallel {tp}: doctor simulates at most "
                        f"{MAX_DEGREE} ranks of {rules.speaker}'s loader; give a degree the model's layers can be split over")], {}
    building = trtllm_building(rules.building(built.name or "", family.fused_layers))
    linears = {n: m for n, m in modules.items() if m.tensor("weight") and len(m.logical_shape) >= 2}
    layers = _layers(linears, declaration, building, ckpt.config or {}, target, family)
    schemes = {s: layer.scheme for layer in layers for s in layer.shards if s}
    findings: list[Finding] = _absent_mtp_layers(rules.mtp_layers(ckpt.config), linears, building, loaders, rules.speaker)
    leaves = {n.rpartition(".")[2] for n in linears}  # the shard names the model stores somewhere
    for layer in layers:
        findings += _layer_findings(layer, linears, leaves, ckpt, loaders, tp, rules.speaker, read)
    return findings, schemes


ATTENTION = frozenset({"self_attn", "attn"})  # a decoder layer registers its attention before its MLP


def load_order(name: str) -> tuple:
    """model.named_modules() order, the order _load_weights_impl loads in (tensorrt_llm/_torch/models/modeling_utils.py
    @ cb4c622c): the inner model before lm_head, layers by index (compared by length then digits: no int() of a
    hostile 10^4-digit name), a decoder layer's attention before its MLP, the rest by name."""
    parts = name.split(".")
    return (parts[0] == "lm_head",) + tuple((0, len(p), p) if p.isascii() and p.isdigit() else (1, p not in ATTENTION, p)
                                            for p in parts)


def load_stops(findings: list[Finding], tp: int) -> tuple[Outcome, ...]:
    """Where each rank stops: the first module in load order whose loader raises (an error finding with the runtime's
    exception), as _load_weights_impl's serial walk raises it (the parallel one re-raises after its log line)."""
    firsts: dict[int, Outcome] = {}
    for f in sorted((f for f in findings if f.severity is Severity.ERROR and f.runtime_error), key=lambda f: load_order(f.subject)):
        for rank in f.ranks:
            if 0 <= rank < tp:
                firsts.setdefault(rank, Outcome(f.subject, rank, "error", f.runtime_error))
    return tuple(firsts[r] for r in sorted(firsts))


def _absent_mtp_layers(mtp: dict[str, int], linears, building: Building, loaders, label: str) -> list[Finding]:
    """MTP layers the config declares but the checkpoint does not store: with MTP speculative decoding on, the release
    builds them and the fused qkv loader finds no shard (TensorRT#4667: GLM-4.6 NVFP4 on 1.2.0rc5 serves only without
    MTP). A warning: the model loads without MTP."""
    out = []
    for owner in mtp:  # a checkpoint naming its layers another way (DeepSeek-V4: layers.N, mtp.N) is not this layout
        if any(n.startswith(owner + ".") for n in linears) or not any(n.startswith(owner.rpartition(".")[0] + ".") for n in linears):
            continue
        layer = f"{owner}.self_attn.qkv_proj" if "qkv_proj" in building.fusions else owner
        error = loaders["fused_missing_weight"]
        out.append(Finding(Severity.WARNING, Kind.MISSING_MODULE, owner,
                           f"{owner}: the config declares this MTP layer (num_nextn_predict_layers) but the checkpoint stores "
                           f"none of it; with MTP speculative decoding {label} builds it and its loader stops "
                           f"({loaders['log'].format(module=layer, error=error)}); serve without MTP, or add the MTP layer "
                           "from the original model", error, ()))
    return out


def _layers(linears: dict[str, StoredModule], declaration: Declaration, building: Building, config: dict,
            target: Target, family) -> list[Layer]:
    mtp = target.profile.rules.mtp_layers(config)
    rule = declaration.rule() if declaration.quantized else None
    grouped: dict[str, list[str]] = {}
    for name in sorted(linears):
        layer, kind = building.built_layer(name)
        grouped.setdefault(layer if kind == "fused" else name, []).append(name)  # a MoE's experts load one by one
    out = []
    for layer, names in sorted(grouped.items()):
        parent, _, leaf = layer.rpartition(".")
        fused = building.fusions.get(leaf) if building.built_layer(names[0])[1] == "fused" else None
        shards = tuple(n if n in linears else "" for n in (f"{parent}.{s}" for s in fused)) if fused else tuple(names)
        scheme, why = _scheme(layer, names, linears, declaration, family, target.profile.rules.loaders["schemes"]), "the config"
        excluded = [n for n in shards if n and fused and hasattr(rule, "exclusions") and rule.exclusions.excludes(n)]
        if excluded and scheme == "bf16" and not rule.exclusions.excludes(layer):
            why = f"the exclusion of {excluded[0]}: one excluded shard makes the whole fused layer BF16"
        owner = next((p for p in mtp if layer.startswith(p + ".")), None)
        if owner is not None and rule is not None and hasattr(rule, "exclusions"):
            if rule.exclusions.excludes(owner):
                scheme, why = "bf16", f"the exclusion of the MTP layer {owner}"
            else:
                why = f"the config: the MTP layer {owner} is built from the target's config and no entry excludes {owner}"
        out.append(Layer(layer, shards, scheme, leaf if fused else "", why))
    return out


def _scheme(layer: str, names: list[str], linears, declaration: Declaration, family, schemes) -> str:
    """What the release builds: never-quantized roles (embeddings, routers) BF16; lm_head quantized only when it is
    not excluded and the checkpoint stores its scale or the per-layer map lists it; else the bound declaration's
    algorithm, as the release builds it (`loaders.schemes`: NVFP4_AWQ is NVFP4 with a pre_quant_scale here)."""
    if not declaration.quantized or family.unquantized_role(names[0], declaration) is not None:
        return "bf16"
    algo = schemes.get(declaration.algorithm(layer) or "", "bf16")
    if layer == "lm_head" and not linears[names[0]].tensor("weight_scale") and (
            declaration.layer_algos is None or declaration.layer_algos.entry("lm_head") is None):
        return "bf16"
    return algo


def _param(scheme: str, logical: tuple[int, ...]) -> tuple[int, ...]:
    """The weight parameter a scheme allocates for a logical [out, in] weight (packed NVFP4: two codes a byte)."""
    return (logical[0], logical[1] // 2) if scheme in ("nvfp4", "w4a16_nvfp4") else tuple(logical)


def _split(layer: str, loaders) -> tuple[int, int]:
    """(the split dim of the weight, the parameter's dim divided by tp): row-parallel layers split their input."""
    row = layer.rpartition(".")[2] in loaders["row_parallel_leaves"]
    return (1, 1) if row else (0, 0)


def _layer_findings(layer: Layer, linears, leaves: set[str], ckpt, loaders, tp: int, label: str, read) -> list[Finding]:
    stored = [linears[s] for s in layer.shards if s]
    missing = [layer.name.rpartition(".")[0] + "." + s for s, n in zip(building_shards(layer), layer.shards) if not n]
    if missing and all(m.rpartition(".")[2] in leaves for m in missing):  # the model has those shards elsewhere
        return [Finding(Severity.ERROR, Kind.LOAD_ERROR, layer.name,
                        f"{layer.name}: {label} builds it from {', '.join(building_shards(layer))}, but {', '.join(missing)} "
                        f"{'is' if len(missing) == 1 else 'are'} not stored, so its fused loader's assertion stops loading "
                        f"({loaders['log'].format(module=layer.name, error=loaders['fused_missing_weight'])})",
                        loaders["fused_missing_weight"], tuple(range(tp)))]
    out = []
    if _reads_scales(layer.name, loaders):  # a model's own loader (DeepSeek's MLA fused_a), not copy_weight
        if layer.scheme != "bf16":
            return []
        error = loaders["bf16_reads_scales"]["error"]
        return [Finding(Severity.ERROR, Kind.LOAD_ERROR, m.name,
                        f"{m.name}: stored {m.precision}, but {label} builds it unquantized ({layer.why} excludes it) and "
                        "its model loader still reads the layer's weight_scale, so loading stops (TensorRT-LLM#16196)",
                        error, tuple(range(tp))) for m in stored if m.precision == "fp8"]
    if layer.scheme in ("nvfp4", "w4a16_nvfp4") and all(m.precision == "nvfp4" for m in stored) and not EXPERT.search(layer.name):
        out += _scale_findings(layer, stored, ckpt, loaders, tp, label, read)
    if out:
        return out
    errors = _copy_errors(layer, stored, loaders, tp)
    if errors:
        first = errors[min(errors)]
        ranks = tuple(sorted(errors))
        what = ", ".join(f"{m.name} stored {m.precision} {list(m.stored_shape)}" for m in stored)
        return [Finding(Severity.ERROR, Kind.LOAD_ERROR, m.name,
                        f"{m.name}: {what}, but {label} builds {layer.name} as {layer.scheme} {list(_param(layer.scheme, _logical(stored, layer)))} "
                        f"(decided by {layer.why}); its copy_weight fails on rank(s) {list(ranks)}", first, ranks)
                for m in stored if _mismatched(m, layer.scheme)]
    for m in stored:
        if _mismatched(m, layer.scheme):
            out.append(Finding(Severity.ERROR, Kind.SILENT_GARBAGE, m.name,
                               f"{m.name}: stored {m.precision}, built {layer.scheme} by {label} ({layer.why}): copy_weight casts "
                               f"the {m.precision} weight to {layer.scheme} without its scales, silently, so the layer computes "
                               "wrong values", None, tuple(range(tp))))
        elif layer.scheme == "bf16" and (extra := [t for r, t in m.roles if r in SCALE_ROLES]):
            out.append(Finding(Severity.WARNING, Kind.IGNORED_TENSORS, m.name,
                               f"{m.name}: {label} builds it unquantized and never asks for {', '.join(extra)}: its "
                               "module-driven loader ignores tensors no module requests, silently"))
    return out


def building_shards(layer: Layer) -> tuple[str, ...]:
    return tuple({"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}.get(layer.leaf, ()))


def _reads_scales(layer: str, loaders) -> bool:
    return any(layer.endswith("." + tail) for tail in loaders["bf16_reads_scales"]["layers"])


def _mismatched(m: StoredModule, scheme: str) -> bool:
    kind = "nvfp4" if m.precision == "nvfp4" else "fp8" if m.precision == "fp8" else "bf16"
    return kind != {"w4a16_nvfp4": "nvfp4"}.get(scheme, scheme)


def _logical(stored: list[StoredModule], layer: Layer) -> tuple[int, ...]:
    return (sum(m.logical_shape[0] for m in stored),) + tuple(stored[0].logical_shape[1:]) if layer.leaf else stored[0].logical_shape


def _copy_errors(layer: Layer, stored: list[StoredModule], loaders, tp: int) -> dict[int, str]:
    """rank -> the error loading the layer's weight (cat of the shards, then copy into the parameter)."""
    dim, _ = _split(layer.name, loaders)
    logical = _logical(stored, layer)
    param = _param(layer.scheme, logical)
    errors = {}
    for rank in range(tp):
        pieces = [copy_weight.rank_slice(m.stored_shape, dim, tp, rank) for m in stored]
        dst = copy_weight.rank_slice(param, dim, tp, rank) if tp > 1 else param
        error = copy_weight.cat_error(pieces) if len(pieces) > 1 else None
        if error is None:
            error = copy_weight.copy_error(dst, copy_weight.cat_shape(pieces) if len(pieces) > 1 else pieces[0])
        if error is not None:
            errors[rank] = error
    return errors


def _scale_findings(layer: Layer, stored: list[StoredModule], ckpt, loaders, tp: int, label: str, read) -> list[Finding]:
    """NVFP4LinearMethod.load_weight_scales: fused shards must carry equal input_scale and weight_scale_2; no
    input_scale at all fails where the release computes alpha from it unconditionally."""
    nvfp4 = loaders["nvfp4"]
    kind = Kind.FUSED_SHARDS if layer.leaf else Kind.LOAD_ERROR  # a fused layer's shards settle it (fix dequantizes them)
    located = ckpt.locate()
    for role, error in (("input_scale", nvfp4["input_scale_differs"]), ("weight_scale_2", nvfp4["weight_scale_2_differs"])):
        names = [t for m in stored if (t := m.tensor(role))]
        raw = {n: (located[n][1].dtype, bytes(read(located[n][0].path, located[n][1]))) for n in names}
        if len(set(raw.values())) > 1:
            return [Finding(Severity.ERROR, kind, layer.name,
                            f"{layer.name}: {label} builds it as one NVFP4 layer and asserts its shards share {role}, but "
                            f"{', '.join(names)} differ (vLLM takes the max instead); requantize the shards with one {role}",
                            error, tuple(range(tp)))]
    if nvfp4["missing_input_scale"] != "dynamic" and layer.scheme == "nvfp4" and not any(m.tensor("input_scale") for m in stored):
        return [Finding(Severity.ERROR, kind, layer.name,
                        f"{layer.name}: built NVFP4 by {label}, whose load_weight_scales computes alpha from input_scale, "
                        "but no shard stores one, so loading stops", nvfp4["missing_input_scale"], tuple(range(tp)))]
    return []

