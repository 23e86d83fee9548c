"""doctor's checks of per-layer algorithms and KV-cache scales against what the config declares.

A layer's declared algorithm (one quant_algo, or MIXED_PRECISION's `quantized_layers` resolved as vLLM
0.32 resolves it) must match what its tensors show (`StoredModule.algorithm`): an FP8 layer stored as
NVFP4, or an NVFP4 layer without its activation scale, loads wrong or not at all. KV-cache scales
(`k_scale` / `v_scale`) and a KV-cache declaration must come together.
"""

from __future__ import annotations

import bisect
import re

from repair.arch import Architecture, ModuleSpec
from repair.codec import scale_values
from repair.doctor.findings import Finding, Kind, Severity
from repair.doctor.missing import own_loader
from repair.formats.base import Declaration, routed_layer
from repair.formats.modules import StoredModule
from repair.formats.nvfp4_health import read_f32_scalar
from repair.io.checkpoint import Checkpoint
from repair.io.ranges import RangeReader
from repair.io.safetensors import TensorInfo
from repair.targets.precision import declared_algorithm
from repair.targets.profiles import VLLM_REFUSED, Target
from repair.targets.config_lists import null_exclusion_list, null_list_vllm_reads
from repair.targets.runtime_rules import quant_method

KV_LEAVES = ("k_scale", "v_scale")
FLOAT8 = ("F8_E4M3", "F8_E5M2")  # safetensors' float8 dtypes
UNSCALED_ADVICE = ("re-export the checkpoint with these tensors' scales, or with the original BF16 tensors in their place "
                   "(fix does neither: no recipe rule selects a tensor stored with no leaf, so --original cannot take it)")
RUNTIME_REFUSED = VLLM_REFUSED  # what vLLM >= 0.25 refuses while reading the config (the vLLM tier compares it)


def algorithm_findings(declaration: Declaration, modules: dict[str, StoredModule], specs: dict[str, ModuleSpec],
                       family: Architecture, precision: dict[str, str]) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes): quantized layers whose stored tensors show another algorithm than the one declared for them.
    Weight-only layers that store an activation scale are one note: vLLM 0.32 loads them as declared and drops it."""
    findings, leftover = [], []
    for m in modules.values():
        stored = m.algorithm
        if stored is None or family.unquantized_role(m.name, declaration) is not None:
            continue
        declared = declared_algorithm(declaration, family, m.name)
        if declared is None or declared == stored:
            continue  # not declared quantized: config_findings reports it
        if declared == "NVFP4" and stored == "W4A16_NVFP4" and precision.get(m.name) == "nvfp4":
            continue  # the loader's health check reports the missing input_scale already
        via = _via(declaration, family, m.name, declared)
        weight_only = (declared, stored) == ("W4A16_NVFP4", "NVFP4")
        if weight_only and not via:
            leftover.append(m.name)
            continue
        findings.append(Finding(Severity.WARNING if weight_only else Severity.ERROR, Kind.ALGORITHM_MISMATCH, m.name,
                                f"{m.name}: declared {declared}{via} but its tensors are {stored} ({_why(declared, stored)})"))
    return findings, _leftover_input_scales(sorted(leftover))


def _leftover_input_scales(names: list[str]) -> list[Finding]:
    """One note for every weight-only layer that stores an activation scale (a published Qwen3.6 export has 121)."""
    if not names:
        return []
    return [Finding(Severity.WARNING, Kind.ALGORITHM_MISMATCH, names[0],
                    f"{len(names)} layer(s) declared W4A16_NVFP4 store an input_scale ({names[0]}, ...): vLLM 0.32 loads "
                    "them weight-only and drops it, logging \"Dropping input_scale from a weight-only W4A16 NVFP4 checkpoint "
                    "(deprecated)\"; a later release may refuse it")]


def _via(declaration: Declaration, family: Architecture, module: str, declared: str) -> str:
    """Where a routed expert's declared algorithm comes from when its own quantized_layers entry says otherwise:
    vLLM builds all experts of a MoE layer as one layer, resolved from the first key under it."""
    runtime = family.runtime_name(module)
    own = declaration.layer_algos.entry(runtime) if declaration.layer_algos is not None else None
    if own is None or own == declared or routed_layer(runtime) == runtime:
        return ""
    return (f" for the routed-experts layer {routed_layer(runtime)} (vLLM builds every expert of it from the first "
            f"quantized_layers key under it; this expert's own entry says {own})")


def _why(declared: str, stored: str) -> str:
    if "FP8" in (declared, stored):
        return "an FP8 layer stores a float8 [out, in] weight with a per-tensor scale, NVFP4 a packed [out, in/2] one with block scales"
    if stored == "W4A16_NVFP4":
        return "no input_scale: the runtime quantizes the activations with an uninitialised scale"
    if stored == "NVFP4_AWQ":
        return "its pre_quant_scale is not applied by a runtime building it as declared, so it computes wrong values"
    if declared == "NVFP4_AWQ":
        return "no pre_quant_scale: the declared per-input-channel scale is missing"
    return "the runtime drops its input_scale"


def layer_map_findings(declaration: Declaration) -> list[Finding]:
    """The two files' quantized_layers maps disagreeing (vLLM reads config.json's, TensorRT-LLM hf_quant_config.json's)."""
    if declaration.layer_algos is None or declaration.hf_layer_algos is None:
        return []
    cfg, hf = declaration.layer_algos.as_dict(), declaration.hf_layer_algos.as_dict()
    if cfg == hf:
        return []
    differ = sorted(n for n in set(cfg) | set(hf) if cfg.get(n) != hf.get(n))
    shown = ", ".join(f"{n} ({cfg.get(n, '-')} / {hf.get(n, '-')})" for n in differ[:5]) + (f" and {len(differ) - 5} more" if len(differ) > 5 else "")
    return [Finding(Severity.WARNING, Kind.CONFIGS_DISAGREE, "config.json / hf_quant_config.json",
                    f"the two config files' quantized_layers disagree on {len(differ)} layer(s) (config.json / hf_quant_config.json): "
                    f"{shown}; vLLM reads config.json, TensorRT-LLM reads hf_quant_config.json")]


def kv_cache_findings(declaration: Declaration, infos: dict[str, TensorInfo]) -> tuple[list[Finding], list[Finding]]:
    """(findings, notes): KV-cache scales without a KV-cache declaration (a warning: a BF16 output that kept them,
    say), and a declaration without scales (a note: vLLM loads it and runs with scale 1.0, logging so itself)."""
    scales = sorted(name for name in infos if name.rpartition(".")[2] in KV_LEAVES)
    if scales and declaration.kv_cache is None:
        return [Finding(Severity.WARNING, Kind.KV_CACHE_SCALES, scales[0],
                        f"{len(scales)} KV-cache scale tensor(s) ({scales[0]}, ...) but no KV-cache quantization is declared "
                        "where vLLM reads it (config.json quantization_config.kv_cache_scheme, or hf_quant_config.json "
                        "kv_cache_quant_algo when config.json has no quantization_config); the runtime ignores or refuses "
                        "them: drop them, or declare the KV-cache quantization they belong to")], []
    if not scales and declaration.kv_cache is not None:
        return [], [Finding(Severity.WARNING, Kind.KV_CACHE_SCALES, "config.json / hf_quant_config.json",
                        f"the config declares a {declaration.kv_cache} KV cache but no k_scale / v_scale tensors are stored; "
                        "vLLM then uses scale 1.0 for every layer's keys and values")]
    return [], []


def refused_algorithm(declaration: Declaration, target: Target, config: dict | None) -> str | None:
    """The error the target raises reading a ModelOpt config's single quant_algo (its data, `refused`, names ModelOpt's
    algorithms: a compressed-tensors config declaring the same scheme is read by another config class), unless its
    rules spare config.json's class that reading."""
    modelopt, algo, rules = (quant_method(declaration) or "").startswith("modelopt"), declaration.quant_algo or "", target.profile.rules
    spared = rules is not None and rules.spares(algo, config)
    return target.profile.refused.get(algo) if modelopt and not spared else None


def runtime_refusal_findings(declaration: Declaration, target: Target, config: dict | None) -> list[Finding]:
    """A single quant_algo the target vLLM refuses while reading the config (before building any layer)."""
    error = refused_algorithm(declaration, target, config)
    if error is None or not target.profile.follows_draft_config:
        return []
    raised = error.split(":")[0].endswith("Error")  # the runtime's exception, else what it does instead (data's words)
    what = f"which {target.spec} refuses while reading the config" if raised else f"and {error}"
    return [Finding(Severity.ERROR, Kind.QUANT_CONFIG, "hf_quant_config.json",
                    f"the config declares quant_algo {declaration.quant_algo}, {what}; dequantize the model (fix --target "
                    f"bf16) to serve it with {target.profile.speaker.split()[0]}", error if raised else None)]


def null_list_findings(ckpt: Checkpoint, declaration: Declaration, target: Target) -> list[Finding]:
    """The exclusion list the target's config reader takes, present but null, where its data says that reader raises
    (SGLang's ModelOptFp4Config.from_config; vLLM's, its profile's null_exclusions_refused): refused while reading the
    config, before any layer is built."""
    rules, release = target.profile.rules, own_loader(target)
    refused = rules.null_exclusions_refused if rules else release.null_exclusions_refused if release else {}
    error = refused.get(quant_method(declaration) or "")
    where = (null_exclusion_list if rules else null_list_vllm_reads)(ckpt.config, ckpt.hf_quant_config) if error else None
    if where is None:
        return []
    return [Finding(Severity.ERROR, Kind.NULL_EXCLUSIONS, where,
                    f"{where} is null, which {target.profile.speaker} refuses while reading the config, before building any layer; "
                    "write a list there ([] for none; fix --target does)", error)]


def nested_algo_findings(ckpt: Checkpoint, target: Target) -> list[Finding]:
    """The quantization config vLLM reads (config.json's quantization_config, else hf_quant_config.json) in ModelOpt's
    nested form (producer modelopt, a `quantization` block) declaring a quant_algo the target's config reading refuses
    there (its data's modelopt_nested_refused: vLLM 0.32 names a quant_method only for the FP8 ones and NVFP4):
    refused while reading the config, before building any layer."""
    release = own_loader(target)
    quant = (ckpt.config or {}).get("quantization_config")
    where = "config.json quantization_config" if quant is not None else "hf_quant_config.json"
    quant = quant if quant is not None else ckpt.hf_quant_config
    block = quant.get("quantization") if isinstance(quant, dict) else None
    producer = quant.get("producer") if isinstance(quant, dict) else None
    if release is None or not isinstance(block, dict) or not isinstance(producer, dict) or producer.get("name") != "modelopt":
        return []
    written = block.get("quant_algo")
    algo = str(written).upper() if written is not None else ""
    refused = release.modelopt_nested_refused
    error = refused.get(algo) if algo in refused else _other_algo(refused.get("*"), written)
    if error is None:
        return []
    return [Finding(Severity.ERROR, Kind.QUANT_CONFIG, where,
                    f"{where} declares quant_algo {algo} in ModelOpt's nested form (producer, quantization), which "
                    f"{target.profile.speaker} {'.'.join(map(str, release.release))} refuses while reading the config, "
                    "before building any layer (it reads that form for the FP8 algorithms and NVFP4 only); declare it in "
                    "config.json's quantization_config as ModelOpt 0.31 and later write it (quant_method \"modelopt\", "
                    "quant_algo at its top level), which vLLM reads first", error)]


def _other_algo(rule: object, written: object) -> str | None:
    """The release's error on an algo its list does not name (its data's "*" rule, `*` the algo as written), for an
    algo written as a plain name (a hostile value is no name to quote: other checks refuse it)."""
    plain = isinstance(written, str) and re.fullmatch(r"[A-Za-z0-9_]{1,64}", written) is not None
    return rule.replace("*", written) if isinstance(rule, str) and plain else None


def float8_findings(modules: dict[str, StoredModule], infos: dict[str, TensorInfo]) -> list[Finding]:
    """Float8 weights without the float32 per-tensor weight_scale that makes them an FP8 layer (missing, per-channel,
    block-wise or another dtype): whatever the target builds, the layer computes wrong values or fails to load."""
    out = unscaled_float8_findings(modules, infos)
    for m in modules.values():
        weight = m.tensor("weight")
        if weight is not None and infos[weight].dtype == "F8_E8M0":  # read for block scales; never a weight
            out.append(Finding(Severity.ERROR, Kind.FP8_SCALE, m.name, f"{m.name}: weight stored float8_e8m0fnu (powers of two "
                               "only, a block-scale dtype): no runtime builds a layer from it (vLLM would cast it into "
                               "float8_e4m3fn codes); re-download or re-export it, or take the layer from the original"))
        if weight is None or m.precision in ("fp8", "fp8_block") or infos[weight].dtype != "F8_E4M3":
            continue
        scale, shape = m.tensor("weight_scale"), list(infos[weight].shape)
        if len(shape) != 2:
            out.append(Finding(Severity.WARNING, Kind.FP8_SCALE, m.name,
                               f"{m.name}: float8_e4m3 weight {shape} is {len(shape)}-D; this tool reads FP8 (per-tensor) 2-D "
                               "[out, in] weights only, so it cannot check or repair this one"))
            continue
        has = "it has none" if scale is None else f"it has {infos[scale].dtype} {list(infos[scale].shape)}"
        out.append(Finding(Severity.ERROR, Kind.FP8_SCALE, m.name,
                           f"{m.name}: float8_e4m3 weight {shape} without a float32 per-tensor weight_scale or a "
                           f"float32/e8m0 one per 128x128 block {[-(-d // 128) for d in shape]} ({has}); a runtime building it FP8 runs with an unloaded scale or fails to load it, one building it "
                           "BF16 reads the float8 codes without their scale (re-download or re-export it, or take the layer "
                           "from the original)"))
    return out


def fused_algorithm_findings(declaration: Declaration, modules: dict[str, StoredModule], family: Architecture,
                             target: Target) -> list[Finding]:
    """Fused layers (qkv_proj, gate_up_proj) whose shards quantized_layers declares with different algorithms:
    vLLM 0.32 resolves the fused layer and raises while building the model (`LayerAlgorithms.lookup`)."""
    if declaration.layer_algos is None:
        return []
    out, who = [], target.profile.speaker
    for fused, shards in family.fused_groups(modules):
        parent = family.runtime_name(shards[0]).rpartition(".")[0]
        runtime = f"{parent}.{fused.rpartition('.')[2]}"
        if declaration.rule().excludes(runtime):
            continue
        error = (declaration.layer_lookup(declaration.layer_algos, runtime)[1] if declaration.layer_lookup else
                 declaration.layer_algos.lookup(routed_layer(runtime), family.fused_layers)[1])
        if error is None:
            continue
        leaf = [s.rpartition(".")[2] for s in shards]
        lookup = declaration.layer_lookup or (lambda algos, name: algos.lookup(name))  # as the target reads the keys
        algos = ", ".join(f"{s.rpartition('.')[2]} {lookup(declaration.layer_algos, family.runtime_name(s))[0] or '-'}" for s in shards)
        out.append(Finding(Severity.ERROR, Kind.FUSED_SHARDS, fused,
                           f"{fused}: {who} builds {', '.join(leaf[:-1])} and {leaf[-1]} as one layer, but quantized_layers "
                           f"declares them with different algorithms ({algos}), so {who} refuses the model while building "
                           "it; declare (and store) every shard with one algorithm", error))
    return out


def kv_scale_health(ckpt: Checkpoint, declaration: Declaration) -> list[Finding]:
    """Under a declared KV-cache quantization each stored k_scale / v_scale must be a positive finite float32 scalar:
    the runtime scales every cached key and value by it (a NaN, zero, negative or non-scalar one computes garbage)."""
    if declaration.kv_cache is None:
        return []
    out = []
    located = ckpt.locate()
    with RangeReader() as read:
        for name in sorted(n for n in located if n.rpartition(".")[2] in KV_LEAVES):
            shard, info = located[name]
            if info.dtype != "F32" or info.nbytes != 4:
                problem = f"is {info.dtype} {list(info.shape)}, not a float32 scalar"
            else:
                found = scale_values.kv_scale_problem(read_f32_scalar(shard.path, info, read))
                problem = found.text if found else None
            if problem:
                out.append(Finding(Severity.ERROR, Kind.KV_CACHE_SCALES, name,
                                   f"{name} {problem}; the {declaration.kv_cache} KV cache scales this layer's cached keys or "
                                   "values by it, so attention computes garbage (re-download or re-export it)"))
    return out


def unscaled_float8_findings(modules: dict[str, StoredModule], infos: dict[str, TensorInfo]) -> list[Finding]:
    """Float8 tensors stored with no `.weight` leaf and no scale beside them (3-D experts as transformers stores them,
    `mlp.experts.gate_up_proj`): a runtime building the layer unquantized copies the float8 codes in as values (vLLM's
    FusedMoE under an excluded `...experts`: a BF16 parameter, no scale, no error), one building it quantized finds no
    scale. A tensor with any `X_...scale...` or `X.…scale…` beside it is another layout, not claimed here."""
    plain = [m for m in modules.values() if (v := m.tensor("value")) and infos[v].dtype in FLOAT8 and len(infos[v].shape) >= 2]
    if not plain:
        return []
    names = sorted(infos)
    out = []
    for m in plain:
        if any("scale" in n[len(m.name):] for sep in "_." for n in _prefixed(names, m.name + sep)):
            continue
        value = infos[m.tensor("value")]
        out.append(Finding(Severity.ERROR, Kind.UNSCALED_FLOAT8, m.name,
                           f"{m.name}: {value.dtype.lower()} tensor {list(value.shape)} with no scale beside it; a runtime "
                           "building its layer unquantized (BF16: vLLM's FusedMoE when the config excludes it) copies the "
                           f"float8 codes in as values, with no scale and no error: meaningless weights; one building it "
                           f"quantized has no scale to load; {UNSCALED_ADVICE}"))
    return out


def _prefixed(names: list[str], prefix: str) -> list[str]:
    """The sorted `names` starting with `prefix` (a bisected range: no scan of 180k names per tensor)."""
    start = bisect.bisect_left(names, prefix)
    end = start
    while end < len(names) and names[end].startswith(prefix):
        end += 1
    return names[start:end]
