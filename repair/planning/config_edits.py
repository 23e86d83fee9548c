"""The config edits of a plan: which exclusion entries (in which spelling, in which list) make every module the plan
turns BF16 excluded for each target release, which requantized ones come back, and what a per-layer map loses."""

from __future__ import annotations

from repair.errors import UsageError
from repair.doctor.findings import Diagnosis
from repair.formats.base import Declaration, Format
from repair.formats.modules import StoredModule
from repair.io.checkpoint import Checkpoint
from repair.planning.built import target_rows
from repair.planning.recipe import Action, Recipe
from repair.planning.runtime_entries import (coverage, entry_names, flat_read, plain_entries, read_keys, read_where_targets_read,
                                             refuse_colliding_names, refuse_pattern_names, runtime_names, shards_alike, unread_fused,
                                             whole_layer_names)
from repair.targets.config_lists import null_exclusion_list

__all__ = ["config_edits", "unlisted_layers"]


def config_edits(ckpt: Checkpoint, fmt: Format, declaration: Declaration, recipe: Recipe, actions: dict[str, Action],
                  modules: dict[str, StoredModule], before: tuple[Diagnosis, ...] = ()):
    """Exclude every module that ends up BF16; un-exclude requantized ones (exact entries only). Each target's names
    and fused layers are those of the class its release builds (`before`: doctor's verdicts, which decided it)."""
    if recipe.drop_quantization:
        return fmt.without_quantization(ckpt), None, ()
    if not declaration.quantized:
        return ckpt.config, ckpt.hf_quant_config, ()
    targets, families = target_rows(ckpt, recipe.from_target, before)  # each release's row: its own names
    covers, excludes_for_any = coverage(targets, families, declaration, ckpt.config)
    made = [n for n, a in actions.items() if a in (Action.DEQUANTIZE, Action.TAKE_ORIGINAL)]
    # a fused layer's BF16 shards are declared together: exact entries for only some of them make the runtime raise
    # (the layers each target's class fuses: a runtime fact)
    made += [s for fam in families for _, shards in fam.scale_groups(modules) if set(made) & set(shards)
             for s in shards if s not in made and not modules[s].is_quantized]
    refuse_colliding_names(ckpt.root, families, made, modules)
    bf16 = runtime_names(targets, families, entry_names(families, made))
    bf16 = whole_layer_names(targets, ckpt.config, modules, set(made), bf16, covers)
    packed = [n for n, a in sorted(actions.items()) if a == Action.REQUANTIZE]
    lists = [list(x) for x in (declaration.ignore, declaration.exclude_modules) if x is not None]
    null = null_exclusion_list(ckpt.config, ckpt.hf_quant_config) is not None  # a list is written in its place
    if not bf16 and not packed and not null and not (len(lists) == 2 and set(lists[0]) != set(lists[1])):
        return ckpt.config, ckpt.hf_quant_config, ()  # nothing to declare or align: a MIXED_PRECISION export gains no empty list
    remove = _redeclared([t.bind(declaration, f, ckpt.config) for t, f in zip(targets, families)] or [declaration], packed,
                         modules, families)
    read_before = flat_read(ckpt.config, remove)
    for _ in range(2):  # again with the fused names a target reads instead of the shards', where one does
        keyed = bf16 + read_keys(targets, families, declaration, ckpt.config, bf16) if declaration.layer_algos else bf16
        config, hf_quant = fmt.with_exclusions(ckpt, keyed, shards_alike(covers, families, bf16), remove=remove)
        config = read_where_targets_read(config, targets, declaration, read_before, [fmt.exclusion_entry(n) for n in bf16])
        refuse_unread_lists(ckpt.root, targets, declaration, config, bf16)
        extra = unread_fused(targets, declaration, families, config, fmt.exclusion_lists(config, hf_quant), bf16, modules)
        if not extra:
            break
        bf16 = sorted(set(bf16) | set(extra))
    entries = {n: fmt.exclusion_entry(n) for n in bf16}  # an entry already listed is not added (it covers for some target)
    alike = shards_alike(covers, families, bf16)
    added = tuple(e for n, e in entries.items() if not all(alike(x, n) or e in x for x in lists))
    reads_plain = [bool(t.profile.rules and t.profile.rules.matchers.get("entries") == "plain") for t in targets]
    if any(reads_plain):  # a release whose matcher has no `re:` (TensorRT-LLM < 1.3): each module's plain name too
        plain = {e: n for n in bf16 if (e := fmt.exclusion_entry(n)) != n}
        config, added = plain_entries(config, plain, keep=not all(reads_plain), added=added)
    refuse_pattern_names(ckpt.root, added, bf16)
    after = fmt.exclusion_lists(config, hf_quant)
    for name in packed:
        for exclusions in after:
            if excludes_for_any(exclusions, name):
                raise UsageError(f"{ckpt.root}: {name} is requantized but exclusion patterns {exclusions} still exclude it; edit the config's exclusions")
    if declaration.layer_algos is not None:  # per-layer map: a layer leaves quantized_layers; only what the lists gained is "added"
        added = tuple(dict.fromkeys(x for entries in after for x in entries if not any(x in before for before in lists)))
    return config, hf_quant, added


def _redeclared(bound: list[Declaration], packed: list[str], modules: dict[str, StoredModule], families) -> list[str]:
    """The requantized modules whose declaration changes: all of them (their exact exclusion entries go), except,
    under a per-layer map, those it already declares (an FP8 layer stays FP8) as each target reads it (`bound`, one
    per target: vLLM maps the keys first, so a key in its spelling declares the layer). A per-layer map puts a layer
    back as NVFP4, so an undeclared FP8 one is refused rather than declared wrong."""
    declaration = bound[0]
    if declaration.layer_algos is None:
        return packed
    undeclared = [n for n in packed if any(d.algorithm(f.runtime_name(n)) is None for d, f in zip(bound, families))]
    for name in undeclared:
        if modules[name].algorithm == "FP8":
            raise UsageError(f"{name} is stored FP8 but {declaration.quant_algo} quantized_layers does not declare it; requantizing "
                             "it would declare it NVFP4; declare it FP8 in quantized_layers first, or dequantize it")
    return undeclared


def unlisted_layers(declaration: Declaration, config: dict | None, hf_quant: dict | None) -> tuple[str, ...]:
    """The keys of a per-layer map (MIXED_PRECISION quantized_layers) the plan takes out: the output's map (from the
    file vLLM reads, as the declaration's) lacks them. A dropped quantization config lists none: it goes whole."""
    if declaration.layer_algos is None:
        return ()
    cfg = (config or {}).get("quantization_config")
    section = (hf_quant or {}).get("quantization")
    after = next((part["quantized_layers"] for part in (cfg, section) if isinstance(part, dict)
                  and isinstance(part.get("quantized_layers"), dict)), None)
    if after is None:
        return ()
    return tuple(k for k, _ in declaration.layer_algos.entries if k not in after)


def refuse_unread_lists(root, targets, declaration: Declaration, config: dict | None, bf16: list[str]) -> None:
    """A release that reads the exclusions fix writes otherwise than it judges them (SGLang 0.5.23 matches DeepSeek-V4's
    Fp8Config lists against its own layer names: READING_REFUSALS) gets no exclusion from fix: said in one line."""
    for target in (t for t in targets if t.profile.rules is not None and bf16):
        said = target.profile.rules.reading_refusal(declaration, config)
        if said:
            shown = ", ".join(bf16[:3]) + (f" (+{len(bf16) - 3} more)" if len(bf16) > 3 else "")
            raise UsageError(f"{root}: fix cannot exclude {shown} for {target.profile.rules.speaker}: the entries it would "
                             f"write are not read there ({said}); store it quantized (FP8 block, as the config declares it), "
                             "or repair for vLLM (--target vllm==0.32.0), which reads them")

