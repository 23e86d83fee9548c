"""How a fix's exclusion entries are spelled, and where they are written, for the runtimes it targets: some releases
read a fused layer only by its own name, some have no `re:` entries, some read config.json's nested ModelOpt block
only at its top level (their data's rules say which; each target's own matcher is asked)."""

from __future__ import annotations

from dataclasses import replace

from repair.errors import BadInput
from repair.formats.base import routed_layer
from repair.targets.config_lists import FLAT_KEYS, flat_exclusions, pattern_syntax
from repair.targets.runtime_rules import quant_method



def coverage(targets, families, declaration, config):
    """(whether a list excludes a module for every target, for any target): each target's own rules say what a list
    covers, on the names its release's row gives the module (`families`, one per target; with no target, the default
    target's alone). Several targets: an exact entry is added unless every one of them reads the list as excluding it."""
    matchers = [f.exclusion_matcher(t.bind(declaration, f, config)) for t, f in zip(targets, families)] or \
        [families[0].exclusion_matcher(declaration)]
    return (lambda entries, name: all(m(entries, name) for m in matchers)), (lambda entries, name: any(m(entries, name) for m in matchers))


def read_keys(targets, families, declaration, config, names: list[str]) -> list[str]:
    """The per-layer map's keys, as written, that a target reads as one of `names` or a layer under it where it maps the
    keys first (`Declaration.layer_keys`: vLLM's apply_dict), other than those names: they leave the map too."""
    out: set[str] = set()
    for target, family in zip(targets, families):
        bound = target.bind(declaration, family, config)
        if bound.layer_keys is not None:
            out.update(k for n in names for k in bound.layer_keys(n))
    return sorted(out - set(names))


def shards_alike(covers, families, names: list[str]):
    """`covers` asked of a fused layer's shards together: a shard among `names` counts as covered when it is, and it is
    listed by its exact name or every one of its siblings there is covered. Exact entries for some shards only are a mix vLLM's
    is_layer_skipped refuses before its substring test of the fused name (`v_proj` in `...qkv_proj` covers v_proj,
    not q/k_proj, for a target that reads shard names): so every shard gets its exact entry, or none does."""
    siblings: dict[str, set[str]] = {}
    for family in families:
        for _, members in family.fused_groups(names):
            for m in members:
                siblings.setdefault(m, set()).update(members)

    def alike(entries, name: str) -> bool:
        group = siblings.get(name, ())
        return covers(entries, name) and (name in entries or all(covers(entries, n) for n in sorted(group)))
    return alike


def entry_names(families, made) -> list[str]:
    """The names exclusion entries use for the modules `made` BF16: each targeted release's own (the prefix its layer
    hands the quant config, where an entry naming the checkpoint module cannot reach it: the profile's `prefixes`; the
    name its model code asks about a layer under, where that differs: SGLang's Gemma 4 vision shards, `layer_names`)."""
    return sorted({f.exclusion_name(n) for f in families for n in made})


def refuse_colliding_names(root: object, families, made, modules) -> None:
    """One line for a module made BF16 whose entry, under the name a targeted release asks it by (`layer_names`,
    `prefixes`), is the own name of another stored module that stays quantized: the entry would exclude that one too."""
    kept = {n for n, m in modules.items() if m.is_quantized} - set(made)
    for name, entry in ((n, f.exclusion_name(n)) for f in families for n in made):
        if entry != name and entry in kept:
            raise BadInput(f"{root}: module {name} is excluded under the name a targeted release asks it by, {entry!r}, which "
                           "is also the name of a stored module that stays quantized, so that entry would exclude both; "
                           "nothing was written; rename or remove one of them in the checkpoint")


def plain_entries(config: dict | None, plain: dict[str, str], keep: bool, added: tuple[str, ...]) -> tuple[dict | None, tuple[str, ...]]:
    """(config, the entries the plan adds) with config.json's `ignore` pattern entries (`plain`: entry -> the module
    it stands for) written as the module names: in their place when every target reads only plain entries, beside
    them (`keep`) when another target reads the pattern and not the name (vLLM's drafter names are `draft_model.`)."""
    def spelled(entry: str) -> list[str]:
        return [entry, plain[entry]] if keep and entry in plain else [plain.get(entry, entry)]

    qc = (config or {}).get("quantization_config")
    if isinstance(qc, dict) and isinstance(qc.get("ignore"), list):
        qc["ignore"] = list(dict.fromkeys(e for entry in qc["ignore"] for e in spelled(entry)))
    return config, tuple(dict.fromkeys(e for entry in added for e in spelled(entry)))


def runtime_names(targets, families, names: list[str]) -> list[str]:
    """The entries that exclude `names` for the recipe's targets: a release that asks a fused layer only by its own
    name (its data's fused policy `fused_name_only`, TensorRT-LLM 1.0) is given the fused name, instead of its shards
    when every target is such a release, besides them when another target reads the shards' names."""
    by_name = [t.profile.rules is not None and t.profile.rules.fused.get("policy") == "fused_name_only" for t in targets]
    if not any(by_name):
        return names
    groups = sorted({g for f, fused_only in zip(families, by_name) if fused_only for g in _whole_groups(f, names)})
    taken = {m for _, members in groups for m in members}
    kept = names if not all(by_name) else [n for n in names if n not in taken]
    return sorted(set(kept) | {fused for fused, _ in groups})


def whole_layer_names(targets, config: dict | None, modules, made: set[str], names: list[str], covers) -> list[str]:
    """`names` with a layer named whole once every linear stored under it ends BF16 (`made`, or stored so): each MTP
    layer a target builds from the model's own config (its data's `draft.mtp_layer`, TensorRT-LLM's
    `model.layers.{num_hidden_layers + i}`), and a routed-experts layer (`...mlp.experts`) one of whose per-expert
    entries some target does not read (TensorRT-LLM asks its MoE only by the layer's name). The layer's name replaces
    each entry under it that every target reads it as covering. Experts first: an MTP layer that stays partly
    quantized still gets its experts layer's name."""
    mtp = {layer for t in targets if t.profile.rules is not None for layer in t.profile.rules.mtp_layers(config)}
    first: dict[str, str] = {}  # a routed-experts layer -> one expert entry: targets read all of its experts alike
    for n in names:
        if (routed := routed_layer(n)) != n:
            first.setdefault(routed, n)
    experts = {layer for layer, n in first.items() if not covers([n], n)}
    for layers in (experts, mtp):
        names = _named_whole(layers, modules, made, names, covers) if layers else names
    return names


def _named_whole(layers: set[str], modules, made: set[str], names: list[str], covers) -> list[str]:
    owner = _owners(layers)
    under: dict[str, list[str]] = {}
    for n in names:
        if (layer := owner(n)) is not None:
            under.setdefault(layer, []).append(n)
    kept = {owner(n) for n, m in modules.items() if m.is_quantized and n not in made} - {None}  # stays quantized
    out = set(names)
    for layer in sorted(set(under) - kept):
        out -= {n for n in under[layer] if covers([layer], n)}
        out.add(layer)
    return sorted(out)


def _owners(layers: set[str]):
    """name -> the layer in `layers` it is under (None): one dict lookup per distinct prefix length, not per layer."""
    prefixes = {layer + ".": layer for layer in layers}
    lengths = sorted({len(p) for p in prefixes})
    return lambda name: next((prefixes[name[:k]] for k in lengths if name[:k] in prefixes), None)


def unread_fused(targets, declaration, families, config, lists: list[list[str]], names: list[str], stored=None) -> list[str]:
    """The fused layers, every shard of which is among `names` (BF16), that some target still builds quantized when
    it reads `lists` as written with the config `config` (SGLang <= 0.5.10 and compressed-tensors models without a
    packed mapping ask the fused name itself, never its shards): their own names, to be excluded too. Each target's
    fused layers and names are its own row's (`families`: the class its release builds). Also a fused layer every
    `stored` shard of which is among `names` where vLLM asks a shard no module stores too (Qwen4Exp's qkv_proj asks
    `indexer.index_qk_proj` without QSA): no entry names that shard's module, and vLLM tests the fused name first
    (quant_utils.py is_layer_skipped, 0.28-0.32), so the layer's own name makes it BF16 whole."""
    found = []
    for target, family in zip(targets, families):
        rules = [target.bind(declaration, family, config).rule(entries) for entries in lists]
        found += [fused for fused, members in _whole_groups(family, names)
                  if fused not in names and any(not r.excludes(family.runtime_name(m)) for r in rules for m in members)]
        found += _unstored_shard_layers(family, declaration, rules, names, stored or {}) if target.profile.rules is None else []
        found += [m for m in _merged_layers(family, names, stored or {}) if any(not r.excludes(family.runtime_name(m)) for r in rules)]
    return sorted(set(found))


def _merged_layers(family, names: list[str], stored) -> list[str]:
    """Layers only the class's loader merges (no packed mapping names them: vLLM 0.32's StableLM qkv_proj) whose every
    stored shard is among `names` (BF16): the runtime asks its quant config about the layer's own name, never a shard's
    (quant_utils.py is_layer_skipped, a prefix whose leaf no packed mapping holds), so that name is the entry."""
    merged = {leaf: shards for leaf, shards in family.merged_layers.items() if leaf not in family.fused_layers}
    if not merged:
        return []
    groups = replace(family, fused_layers=merged).fused_groups(set(stored) | set(names))
    return [layer for layer, members in groups if all(m in names for m in members)]


def _unstored_shard_layers(family, declaration, rules, names: list[str], stored) -> list[str]:
    """The fused layers vLLM still refuses (shards that disagree) where no stored shard stays quantized (`stored`:
    module -> StoredModule) and it asks a shard no module stores."""
    out = []
    for fused, members in family.fused_groups(names):
        asked = family.asked_shards(fused, members)
        parent = fused.rpartition(".")[0]
        kept = [s for s in asked if s in stored and stored[s].is_quantized and s not in members]  # stays packed: not whole
        if fused in names or kept or len(asked) == len(members) or not parent:
            continue
        shards = tuple(family.runtime_name(s) for s in asked)
        if any(declaration.format.fused_refusal(family.runtime_name(fused), shards, r) for r in rules):
            out.append(fused)
    return out


def read_where_targets_read(config: dict | None, targets, declaration, read_before: tuple[str, ...] | None = None,
                            written: list[str] = ()) -> dict | None:
    """config.json's nested ModelOpt block with an exclusion list also at the top level (`ignore`), where a target
    whose data says it drops the nested list (SGLang: configs/model_config.py merges quant_algo there and takes the
    flat branch) reads it; vLLM reads the nested one. `read_before`: the top-level list the input had (None: none).
    When some target reads the nested list (the fix made it right), the top level gets it too, then `read_before`'s
    other entries; when every target drops it, the top level keeps `read_before` plus the fix's entries (`written`):
    nested entries SGLang never read may name layers stored packed."""
    method = quant_method(declaration)
    drops = [t.profile.rules is not None and method in t.profile.rules.nested_drops for t in targets]
    if any(drops) and flat_exclusions(config) is not None:
        qc = config["quantization_config"]
        base = list(read_before) if all(drops) and read_before is not None else list(qc["quantization"].get("exclude_modules") or [])
        extra = written if all(drops) and read_before is not None else read_before or ()
        qc["ignore"] = base + [e for e in dict.fromkeys(extra) if e not in base]
    return config


def flat_read(config: dict | None, remove) -> tuple[str, ...] | None:
    """The top-level list SGLang reads beside config.json's nested ModelOpt block (None: there is none), without the
    entries `remove` takes out (requantized modules)."""
    qc = (config or {}).get("quantization_config")
    if flat_exclusions(config) is None or not any(k in qc for k in FLAT_KEYS):
        return None
    return tuple(e for e in flat_exclusions(config) if e not in remove)


def _whole_groups(family, names: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """(fused layer, shards) for every fused layer all of whose shards are in `names`."""
    return [(fused, members) for fused, members in family.fused_groups(names)
            if len(members) == len(family.fused_layers[fused.rpartition(".")[2]])]


def refuse_pattern_names(root: object, entries, names=()) -> None:
    """One line for a plain entry the plan would write that holds pattern syntax (a module so named in the
    checkpoint): written verbatim it would exclude other modules, or none, or stop SGLang's re.fullmatch. An entry
    that is a module's own name (`names`) starting `re:` is one too: TensorRT-LLM >= 1.3 reads the rest as a regex."""
    names = frozenset(names)
    for entry in entries:
        if entry.startswith("re:") and entry not in names:
            continue  # a `re:` pattern the format wrote for a module
        found = pattern_syntax(entry)
        if found:
            raise BadInput(f"{root}: module {entry!r} holds {found!r}, which runtimes read as pattern syntax in an exclusion "
                           "entry (SGLang as a regex, vLLM and TensorRT-LLM as a glob, TensorRT-LLM >= 1.3 a `re:` entry as "
                           "a regex), so no entry written as its name excludes exactly it; nothing was written; rename the "
                           "module in the checkpoint")
