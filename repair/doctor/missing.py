"""Modules the architecture expects but the checkpoint lacks (issue 25.7).

The loader simulation walks the stored tensors, so a module that is not stored at all was never looked at.
What the target does then is its release's own loader's (`consequence`, from the profile's `missing_weights`): vLLM
0.28-0.32 do not check a quantized checkpoint for unfilled weights by default (the layer runs on uninitialised memory,
silently); with enable_weights_track 0.32 stops, 0.28/0.30 still pass a missing linear; an unquantized checkpoint
stops only on a layer without a quant method (a norm). A module the release builds in no layer of that name (the
profile's per-layer rules: Gemma 3n's KV-shared k/v) is not expected. Two sources of truth:

- an architecture row with a loader profile (`arch.expected_modules`) names every module the model defines;
- any other family: decoder layers are stacks (`<prefix>.layers.N.<rest>`). A module `<rest>` is expected in
  layer N when layer N stores a sibling in the same block (`mlp`, `self_attn`, ...) and the other layers that
  store that sibling also store `<rest>`, all but at most one in eight. Hybrid and MoE families differ between
  layers by whole blocks or by many layers (DeepSeek's dense first layers, Qwen3.5's linear-attention layers,
  Gemma 4's full-attention layers without v_proj), which this rule leaves alone. Where config.json declares the
  layers' kinds (`layer_types`, Nemotron-H's `hybrid_override_pattern`; layers past `num_hidden_layers` are MTP
  layers), only layers of one kind are compared. Tensors that are only KV-cache scales (compressed-tensors'
  `self_attn.k_scale`) make no module: a missing KV scale is kv-cache-scales' finding. A layer of which nothing is
  stored, between stored ones, is missing whole; so are the layers past the last stored one of the stack beside
  `embed_tokens`, up to config.json's num_hidden_layers.
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Iterable

from repair.arch import Architecture, ModuleSpec, ReleaseProfile
from repair.arch.layer_rules import MOST_LAYERS, decoder_depth, dropped_modules, text_part
from repair.doctor.findings import Finding, Kind, Severity
from repair.targets.profiles import Target

LAYER = re.compile(r"(.*?\b(?:layers|h|blocks))\.([0-9]{1,6})\.(.+)", re.DOTALL)  # fullmatch: linear on any name
SCALE_ONLY = ("k_scale", "v_scale", "q_scale", "prob_scale")  # attention scales, not weights of a module
MOST_PATTERNS = 64  # a block whose modules show more distinct layer patterns than this is too irregular to judge
ADVICE = "re-download or re-export the checkpoint, or take the module from the original model"
UNFILLED = "'ValueError: Following weights were not initialized from checkpoint'"
TRACK = "--model-loader-extra-config '{\"enable_weights_track\": true}'"


def own_loader(target: Target) -> ReleaseProfile | None:
    """The generated release whose loader is the target's own: vLLM's layer rows lent to SGLang or TensorRT-LLM are
    not their loaders (SGLang 0.5.23 builds Gemma 3n's KV-shared k/v that vLLM drops)."""
    release = target.release
    return release if release is not None and release.runtime == target.profile.runtime else None


def unbuilt(target: Target, family: Architecture, config: dict | None) -> frozenset[str]:
    """Modules the target builds in no layer of that name (`bf16` reads the newest vLLM rows as its runtime's); rows
    lent to another runtime are not its build: its rules file's own `dropped_in_layers` (SGLang 0.5.23's DeepSeek-V4
    compressors, learned from its model) say, or nothing does."""
    rules = target.profile.rules
    if target.release is not None and own_loader(target) is None:
        own = rules.dropped_in_layers if rules is not None else {}
        return dropped_modules(tuple(d for a in family.architectures for d in own.get(a, ())), config)
    return family.dropped(config)


def consequence(target: Target, quantized: bool) -> str:
    """What the target's loader does with the missing layer: its release's own DefaultModelLoader, run by the profile
    generator on a checkpoint leaving one linear / one norm unfilled, by default and with weight tracking (another
    runtime's target borrows only vLLM's layer rows, not its loader: nothing is claimed for it)."""
    release, rules = own_loader(target), target.profile.rules
    if release is None and rules is not None and rules.missing_weights:  # a data release's own loader, probed
        silent = "refused" not in rules.missing_weights.values()
        return (f"{rules.speaker} {_checks(rules.missing_weights)}" + (": it loads without an error, and the layer (of a "
                "fused layer, that shard's rows) runs on uninitialised memory, silently" if silent else "") + f"; {ADVICE}")
    facts = (release.missing_weights if release is not None else {}).get("quantized" if quantized else "unquantized")
    if release is None or not isinstance(facts, dict) or not isinstance(facts.get("default"), dict):
        return (f"{target.profile.speaker} refuses such a checkpoint or runs the layer on uninitialised memory (its "
                f"missing-weights check is not profiled for this target); {ADVICE}")
    kind = "a quantized checkpoint" if quantized else "an unquantized checkpoint"
    text = f"{release.label}, on {kind}, by default, {_checks(facts['default'])}"
    if isinstance(facts.get("tracked"), dict) and facts["tracked"] != facts["default"]:
        text += f"; with {TRACK} it {_checks(facts['tracked'])}"
    return f"{text}; where nothing stops it, the layer runs on uninitialised memory, silently; {ADVICE}"


def _checks(outcome: dict) -> str:
    """One loader mode's outcome ({"linear", "norm"} -> "refused" | "unchecked") in words."""
    linear, norm = outcome.get("linear") == "refused", outcome.get("norm") == "refused"
    if linear and norm:
        return f"stops on any unfilled weight ({UNFILLED})"
    if norm:
        return f"checks only layers without a quant method (a missing norm stops it: {UNFILLED}; a missing linear layer is not noticed)"
    if linear:
        return f"checks only layers with a quant method ({UNFILLED}; a missing norm is not noticed)"
    return "does not check for unfilled weights"


def missing_modules(tensors: Iterable[str], specs: dict[str, ModuleSpec], family: str, config: dict | None = None,
                    dropped: frozenset[str] = frozenset(), required: tuple[tuple[str, str], ...] = ()) -> dict[str, str]:
    """Expected module (or tensor) name -> why it is expected, for every one no stored tensor provides; `dropped`:
    modules the runtime builds in no layer of this name (the profile's per-layer rules), never expected; `required`:
    the row's `required_modules`."""
    names = set(tensors)
    if specs:
        present = names | {t.rpartition(".")[0] for t in names}
        return {s: f"{family} defines it (its expected modules, from config.json)" for s in sorted(specs) if s not in present}
    module, _, leaf = zip(*(t.rpartition(".") for t in names)) if names else ((), (), ())
    kept = {m for m, x in zip(module, leaf) if x not in SCALE_ONLY}
    gaps = _layer_gaps(kept, layer_kinds(config))
    found = {**_tail_layers(kept, decoder_depth(config)), **gaps, **_required_gaps(set(module), required)}
    return dict(sorted((name, why) for name, why in found.items() if name not in dropped))


def missing_findings(tensors: Iterable[str], specs: dict[str, ModuleSpec], family: str, config: dict | None = None,
                     dropped: frozenset[str] = frozenset(), then: str = ADVICE,
                     required: tuple[tuple[str, str], ...] = ()) -> list[Finding]:
    """`then`: what the target does with it (`consequence`)."""
    return [Finding(Severity.ERROR, Kind.MISSING_MODULE, name, f"{name}: not stored, but {why}; {then}")
            for name, why in missing_modules(tensors, specs, family, config, dropped, required).items()]


def _required_gaps(modules: set[str], required: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """The modules a required pattern (`model.layers.*.self_attn.indexer.q_layernorm`) names in each layer that stores
    a module of its block (the segment after its one `*`: `self_attn`) but not that one; one pass over the stored
    modules per (stack, block)."""
    wanted: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    for pattern, why in required:
        head, star, rest = pattern.partition(".*.")
        block = rest.partition(".")[0]
        if star and "*" not in rest and block != rest:  # else no layer number, several, or no block to find layers by
            wanted[(f"{head}.", f"{block}.")].append((rest, why))
    out = {}
    for (head, block), rests in wanted.items():
        layers = set()
        for name in modules:
            if name.startswith(head):
                layer, _, tail = name[len(head):].partition(".")
                if tail.startswith(block) and layer.isascii() and layer.isdigit() and len(layer) <= 6:
                    layers.add(layer)
        for layer in sorted(layers, key=int):
            out.update({f"{head}{layer}.{rest}": f"{why}, and layer {layer} stores {block[:-1]} modules"
                        for rest, why in rests if f"{head}{layer}.{rest}" not in modules})
    return out


def layer_kinds(config: dict | None) -> dict[int, str]:
    """Decoder layer -> its declared kind, from config.json (hostile: anything malformed declares nothing)."""
    part = text_part(config)
    out: dict[int, str] = {}
    kinds = part.get("layer_types") if isinstance(part.get("layer_types"), list) else part.get("hybrid_override_pattern")
    if isinstance(kinds, (list, str)) and len(kinds) <= MOST_LAYERS:
        out.update({i: k for i, k in enumerate(kinds) if isinstance(k, str)})
    count = decoder_depth(config)  # layers past it: MTP layers (DeepSeek's model.layers.61)
    out.update({i: "mtp" for i in range(count, count + 64) if count})
    return out


def _tail_layers(modules: set[str], depth: int) -> dict[str, str]:
    """Decoder layers past the last stored one: the stack beside `embed_tokens` holds num_hidden_layers layers."""
    stored: dict[str, int] = {}
    for name in modules:
        match = LAYER.fullmatch(name)
        if match and match[1].endswith(".layers") and f"{match[1][:-len('layers')]}embed_tokens" in modules:
            stored[match[1]] = max(stored.get(match[1], -1), int(match[2]))
    return {f"{stack}.{layer}": f"config.json declares {depth} decoder layers and {stack}.0-{last} are stored"
            for stack, last in stored.items() if depth - last - 1 <= MOST_PATTERNS for layer in range(last + 1, depth)}


def _layer_gaps(modules: set[str], kinds: dict[int, str]) -> dict[str, str]:
    """Modules missing from a few decoder layers of a stack that its other layers all store (see the docstring)."""
    layers_of: dict[tuple[str, str], set[int]] = defaultdict(set)  # (stack, module within the layer) -> layer numbers
    stacks: dict[str, set[int]] = defaultdict(set)
    for name in modules:
        match = LAYER.fullmatch(name)
        if match:
            layers_of[(match[1], match[3])].add(int(match[2]))
            stacks[match[1]].add(int(match[2]))
    out = _whole_layers(stacks)
    classes: dict[tuple[str, str, str, frozenset[int]], list[str]] = defaultdict(list)  # (stack, kind, block, layers)
    for (stack, rest), layers in layers_of.items():
        by_kind: dict[str, set[int]] = defaultdict(set)
        for layer in layers:
            by_kind[kinds.get(layer, "")].add(layer)
        for kind, some in by_kind.items():  # layers of one declared kind are compared with each other only
            classes[(stack, kind, rest.split(".")[0], frozenset(some))].append(rest)
    blocks: dict[tuple[str, str, str], list[frozenset[int]]] = defaultdict(list)
    for stack, kind, block, layers in classes:
        blocks[(stack, kind, block)].append(layers)
    for (stack, kind, block), patterns in blocks.items():
        if len(patterns) > MOST_PATTERNS:
            continue
        for have in patterns:  # layers storing some module of the block
            for want in patterns:  # layers storing another one
                gap, both = have - want, have & want
                if not gap or not both or len(gap) > max(1, len(both) // 8):
                    continue
                sibling = min(classes[(stack, kind, block, have)])
                for rest in classes[(stack, kind, block, want)]:
                    for layer in sorted(gap):
                        out.setdefault(f"{stack}.{layer}.{rest}",
                                       f"the other {len(both)} layer(s) of {stack} that store {block} modules like {sibling} store it")
    return dict(sorted(out.items()))


def _whole_layers(stacks: dict[str, set[int]]) -> dict[str, str]:
    """Decoder layers of which nothing is stored while layers before and after them are (layers count from 0 up)."""
    out = {}
    for stack, present in stacks.items():
        first, last = min(present), max(present)
        if last - first + 1 - len(present) > MOST_PATTERNS:
            continue  # sparse numbering on purpose, not a lost layer
        for layer in range(first, last):
            if layer not in present:
                out[f"{stack}.{layer}"] = f"{stack}.{first}-{last} around it are stored and a stack of layers has no holes"
    return out
