"""What a runtime's weight loaders do with each stored layer, from its release file's loader table (`rules.loaders`).

For a release described by data (repair/targets/data/<runtime>-<release>.json) doctor does not simulate vLLM's
loader; it compares each stored weight with the scheme the runtime builds the layer as (doctor/schemes.py, under
the release's own matchers) and looks up, per loader family and direction, what happens: an error template (the
runtime's exact text, shapes filled in per rank), `zero_pad` (SGLang's row-parallel BF16 loader pads a packed
weight half as wide with zeros: garbage on rank 0, all zeros on rank 1 at TP 2) or `silent_cast` (a BF16 weight
narrowed into the packed parameter and cast to uint8). Tensors the built layer has no parameter for are skipped
with the runtime's log line (`unknown_tensors`). Silent outcomes are errors: the runtime will not say.
"""

from __future__ import annotations

import re

from repair.arch import Architecture
from repair.arch.registry import Resolved
from repair.doctor.exclusion_hint import exclusion_hint
from repair.doctor.findings import Finding, Kind, Severity
from repair.formats.base import Declaration
from repair.formats.modules import FULL_PRECISIONS, StoredModule
from repair.io.checkpoint import Checkpoint
from repair.targets.precision import PACKED
from repair.targets.profiles import Target
from repair.targets.vllm_loader import Outcome

NUMBER = re.compile(r"\.\d+(?=\.|$)")
PARAMS = {"bf16": ("weight", "bias"), "fp8": ("weight", "weight_scale", "input_scale", "bias"),
          "fp8_block": ("weight", "weight_scale", "bias")}  # compressed-tensors' W8A8 FP8 block: dynamic activations
FP8_KINDS = frozenset({"fp8", "fp8_block"})
DTYPE = {"bf16": "torch.bfloat16", "packed": "torch.uint8"}


def table_loads(modules: dict[str, StoredModule], schemes: dict[str, str], ckpt: Checkpoint, target: Target,
                family: Architecture, tp: int, leaves: dict[str, str], built: Resolved,
                declaration: Declaration) -> tuple[list[Finding], tuple[Outcome, ...]]:
    """(findings, the first error per rank in load order) for every stored layer the target builds; `leaves` are the
    parameter names a packed layer of the checkpoint's format has (Format.RUNTIME_LEAVES); `built`: the listed class
    the target builds (Target.built); `declaration`: as the target reads it (its hints name the entries to write)."""
    rules = target.profile.rules
    architecture = built.name or ""
    building = rules.building(architecture, family.fused_layers, ckpt.config)
    entry = target.release.entries.get(architecture, {}) if target.release else {}
    located = ckpt.locate()
    kv = _kv_heads(ckpt.config or {})  # fewer KV heads than ranks: QKVParallelLinear replicates them (k/v rows whole heads)
    findings, errors = [], []
    unread = rules.entries_unread(declaration)  # no entry fix writes is read there: the only advice is to store it quantized
    for name, built in sorted(schemes.items()):
        m = modules[name]
        layer, kind = building.built_layer(family.runtime_name(name))
        loader = _moe_loader(name, rules) if kind == "moe" else _loader(layer, kind, entry, rules,
                                                                        rules.plain_layers.get(architecture, ()))
        stacked = layer if kind == "fused" and rules.raises_on_extra(architecture, layer) else None
        split = min(tp, kv) if loader == "qkv" and kv and name.endswith(("k_proj", "v_proj")) else tp
        hint = None if m.is_quantized else f"store it quantized ({unread})" if unread else \
            f"{exclusion_hint(name, modules, declaration, family, ckpt.config) or 'exclude it'} (fix --target does), or store it quantized"
        finding, outcomes = _one(m, built, loader, target, (tp, split), (*leaves, "bias"), stacked, hint,
                                 tuple(leaf for leaf, role in leaves.items() if role == "weight_scale"))
        findings += [finding] if finding else []
        errors += outcomes
    order = sorted(errors, key=lambda o: (located[o.tensor][0].path.name, o.tensor) if o.tensor in located else ("", o.tensor))
    first: dict[int, Outcome] = {}
    for o in order:
        first.setdefault(o.rank, o)
    return findings, tuple(first[r] for r in sorted(first))


def _loader(layer: str, kind: str, entry: dict, rules, plain: tuple[str, ...] = ()) -> str:
    """The loader family of a built layer: its class in the layer rows, else by its name."""
    leaf = layer.rpartition(".")[2]
    if layer.removeprefix("model.") in plain:  # built as a plain torch.nn.Linear
        return "plain"
    recorded = entry.get("modules", {}).get(NUMBER.sub(".*", layer), {}).get("layer")
    if recorded in rules.layer_classes:
        return rules.layer_classes[recorded]
    if kind == "fused":  # another fusion (MLA's fused_qkv_a_proj_with_mqa) concatenates its shards first: no table row
        return {"qkv_proj": "qkv", "gate_up_proj": "merged_column"}.get(leaf, "fused")
    if leaf == "lm_head":
        return "lm_head"
    return "row_parallel" if leaf in rules.row_parallel_leaves else "column_parallel"


def _moe_loader(name: str, rules) -> str:
    """A routed expert's shard: the MoE's w2 (its row-parallel down projection) or w13 loader, where the release's
    data has them (`moe_w2`, `moe_w13`), else the MoE loader no table row describes."""
    family = "moe_w2" if name.rpartition(".")[2] in rules.row_parallel_leaves else "moe_w13"
    return family if family in rules.loaders else "moe"


def _kv_heads(config: dict) -> int | None:
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    heads = config.get("num_key_value_heads", text.get("num_key_value_heads"))
    return heads if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0 else None


def _one(m: StoredModule, built: str, loader: str, target: Target, ranks_split: tuple[int, int], packed_params: tuple[str, ...],
         stacked: str | None = None, hint: str | None = None,
         scales: tuple[str, ...] = ()) -> tuple[Finding | None, list[Outcome]]:
    """One stored layer against the scheme built; `stacked` is the fused layer's name when its load_weights branch
    indexes params_dict unchecked (a tensor the built layer has no parameter for raises KeyError there); `hint`: what
    to do with a BF16 layer (the entries to write to exclude it, exclusion_hint, where the release reads some); `scales`:
    the format's names of an FP8 layer's weight scale (DeepSeek-V4's `scale`, which the model's own load_weights renames to the
    parameter: SGLang 0.5.23 deepseek_v4.py:5168-5179)."""
    (tp, split), rules, who = ranks_split, target.profile.rules, target.profile.speaker
    exclude = hint or "exclude it (fix --target does), or store it quantized"
    ranks = tuple(range(tp))
    packed, wants_packed = m.precision == "nvfp4", built in PACKED
    params = packed_params if wants_packed else PARAMS.get(built, PARAMS["bf16"]) + (scales if built in FP8_KINDS else ())
    skipped = [t for t in m.tensors if t.rpartition(".")[2] not in params]
    raised = [(t, f"KeyError: '{stacked}.{t.rpartition('.')[2]}'") for t in skipped] if stacked else []
    skip_text = (f"; it skips {', '.join(skipped)} ('{rules.unknown_tensors['text'].format(name=skipped[0])}', logged "
                 "only)" if skipped and rules.unknown_tensors["policy"] == "log_skip" else "")
    if raised:
        skip_text = f"; its load_weights stops on {raised[0][0]} first ({raised[0][1]}: no such parameter)"
    stored = f"{'packed NVFP4' if packed else m.precision} {list(m.stored_shape)}"
    head = f"{m.name}: stored {stored} but {target.spec} builds it {built}"
    if packed == wants_packed and ({m.precision} & FP8_KINDS) == ({built} & FP8_KINDS):
        if not skip_text:
            return None, []
        return Finding(Severity.ERROR, Kind.IGNORED_TENSORS, m.name,
                       f"{head} and silently drops tensors it has no parameter for{skip_text}; drop them (fix --target "
                       "does), or declare the layer quantized if it is meant to be"), []
    bound = m.precision in FULL_PRECISIONS and not skipped  # a stored-BF16 layer built quantized: the config's doing
    direction = "packed_into_bf16" if packed and built == "bf16" else "bf16_into_packed" if wants_packed and not packed else None
    behaviour = rules.loaders.get(loader, {}).get(direction) if direction else None
    out, inn = m.logical_shape[0], m.logical_shape[-1]
    if behaviour == "zero_pad":
        zeros = [r for r in ranks if r * (inn // tp) >= inn // 2]
        said = (f"{who} loads this as zeros on rank {', '.join(map(str, zeros))}" if zeros else
                f"{who} zero-pads this to [{out}, {inn}] and reads the packed bytes as BF16 values")
        return Finding(Severity.ERROR, Kind.SILENT_GARBAGE, m.name,
                       f"{said}, without an error ({head}; its {loader.replace('_', '-')} loader pads a weight that is too narrow){skip_text}; "
                       "dequantize it (fix --target does), or declare it quantized", None, ranks, bound,
                       repairs=(m.name,) if m.is_quantized else ()), []
    if behaviour == "silent_cast":
        return Finding(Severity.ERROR, Kind.SILENT_GARBAGE, m.name,
                       f"{who} casts this BF16 weight into its packed uint8 parameter without an error ({head}; its "
                       f"{loader.replace('_', '-')} loader narrows the weight to the packed width), and the block scales it needs are "
                       f"never loaded; {exclude}", None, ranks, bound,
                       repairs=(m.name,)), []
    text = _filled(behaviour, out, inn, packed, loader, split) if behaviour else None
    fix = "dequantize it (fix --target does)" if m.is_quantized else exclude
    return (Finding(Severity.ERROR, Kind.LOAD_ERROR, m.name,
                    f"{head}; its {loader.replace('_', '-')} loader cannot take the stored weight, so loading stops"
                    f"{skip_text}; {fix}", text, ranks, bound, repairs=(m.name,)),
            [Outcome(m.tensor("weight") or m.name, r, "error", text or f"{who}'s {loader} loader refuses {stored}") for r in ranks]
            + [Outcome(t, r, "error", error) for t, error in raised for r in ranks])


def _filled(template: str, out: int, inn: int, packed: bool, loader: str, split: int) -> str:
    """The runtime's error text for one rank: the parameter's slice (rows split `split` ways) against the loaded one's."""
    rows = out if loader in ("replicated", "plain") else out // max(split, 1)
    full, half = f"torch.Size([{rows}, {inn}])", f"torch.Size([{rows}, {inn // 2}])"
    param, loaded = (full, half) if packed else (half, full)
    cols = (inn, inn // 2) if packed else (inn // 2, inn)
    return template.format(param=param, loaded=loaded, pdtype=DTYPE["bf16" if packed else "packed"],
                           ldtype=DTYPE["packed" if packed else "bf16"], param_cols=cols[0], loaded_cols=cols[1])
