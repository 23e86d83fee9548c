"""Exclusion lists as a vLLM release rewrites them with the built class's weight-name mappers before any layer asks
(the profile row's `exclusion_mappers`, recorded by tools/vllm_exclusion_mappers.py while the release builds the class).

vLLM hands the class's hf_to_vllm_mapper (renames only) to the quant config's apply_vllm_mapper (model_loader/utils.py:
361-381, interfaces.py:1253-1260 in 0.32), which rewrites the list; each layer then asks it with its own prefix, in
vLLM's spelling. The config kinds rewrite differently (the same in 0.28, 0.30 and 0.32), the format's `ENTRY_MAPPING`:
  "modelopt": an entry `X*` (X not ending in `.`) becomes `X` and `X.*`, then every entry is mapped, an entry the
      mapper drops is gone (modelopt.py:262-281 in 0.32, 256-275 in 0.30, 217-236 in 0.28): `...qkv_*` no longer
      reaches `...qkv_proj`, and `layers.0.mlp*` becomes a substring test of `layers.0.mlp`;
  "paths": only entries that are layer paths (holding a `.`, not `re:`) are mapped (compressed_tensors.py:129-158);
  "every": every entry is mapped (Fp8Config, fp8.py:153-155; DeepSeek-V4's fp8 form inherits it).
A class with no mapper records none, and its list is read as written. `MappedRule` asks the format's rule (fused
tests included) over the rewritten list, with the asked name in vLLM's spelling (the same mappers), and answers
`used_entries` in the list's own entries, so an entry written in either spelling counts where vLLM's reading does.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

from repair.arch.base import Architecture
from repair.arch.profiled import NUMBER, BuiltQuantized, with_drafter
from repair.formats.algorithms import LayerAlgorithms
from repair.formats.base import Declaration, routed_layer

KINDS = ("regex", "substr", "stacked", "prefix", "suffix")  # WeightsMapper._map_name_with_shard's order (utils.py:89-144)


@dataclass(frozen=True)
class NameMapper:
    """One recorded mapper: (kind, ((old, new or None), ...)) in the order the release applies them."""

    maps: tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...]
    _compiled: dict = field(default_factory=dict, compare=False, hash=False, repr=False)  # regex text -> pattern

    @classmethod
    def read(cls, data: Mapping) -> "NameMapper":
        unknown = set(data) - set(KINDS)
        if unknown:  # a generator writing a map this reader does not apply is our bug, not the user's
            raise KeyError(f"exclusion_mappers kind {sorted(unknown)}")
        return cls(tuple((k, tuple((old, new) for old, new in data[k])) for k in KINDS if data.get(k)))

    def __call__(self, name: str) -> str | None:
        """`name` as the mapper leaves it (None: dropped). Each map tests the name as the previous ones left it."""
        for kind, pairs in self.maps:
            for old, new in pairs:
                hit = self._hit(kind, old, name)
                if not hit:
                    continue
                if new is None:
                    return None
                name = self._apply(kind, old, new, name)
        return name

    def _hit(self, kind: str, old: str, name: str) -> bool:
        if kind == "regex":
            return self._pattern(old).search(name) is not None
        if kind == "prefix":
            return name.startswith(old)
        return name.endswith(old) if kind == "suffix" else old in name

    def _apply(self, kind: str, old: str, new: str, name: str) -> str:
        if kind == "regex":
            return self._pattern(old).sub(new, name)
        if kind == "suffix":
            return new.join(name.rsplit(old, 1))
        return name.replace(old, new, 1)

    def _pattern(self, text: str) -> re.Pattern:
        found = self._compiled.get(text)
        if found is None:
            found = self._compiled[text] = re.compile(text)
        return found


def rewritten(entries: Iterable[str], mappers: tuple[NameMapper, ...], how: str) -> dict[str, tuple[str, ...]]:
    """Each entry as the release's list holds it after the rewrite -> the entries it came from (list order kept).
    Each mapper is one apply_vllm_mapper call on the list the previous call left, ModelOpt's split included:
    Gemma3nForCausalLM's build makes two (its own, its inner module's), so `X**` ends as `X`, `X.*` and `X*.*`
    (vLLM 0.32's own config, handed two mappers)."""
    out: dict[str, list[str]] = {}
    for entry in entries:
        names = [entry]
        for mapper in mappers:
            names = [m for name in names for m in _one_call(name, mapper, how)]
        for name in names:
            out.setdefault(name, []).append(entry)
    return {k: tuple(dict.fromkeys(v)) for k, v in out.items()}


def _one_call(name: str, mapper: NameMapper, how: str) -> list[str]:
    """`name` after one apply_vllm_mapper call of the config kind `how` (a name the mapper drops is gone)."""
    made = [name[:-1], name[:-1] + ".*"] if how == "modelopt" and len(name) >= 2 and name[-1] == "*" \
        and name[-2] != "." else [name]
    mapped = [mapper(n) if how != "paths" or ("." in n and not n.startswith("re:")) else n for n in made]
    return [n for n in mapped if n is not None]


@dataclass(frozen=True)
class Spelling:
    """The name vLLM asks its list about for a module: a layer the class builds (its row's module patterns), or a
    shard of one it builds fused, as it is (the profile's `prefixes` are such names already, and a mapper need not
    leave them alone: FalconH1's substring map `mamba` -> `mamba.mamba`); any other name through the mappers, a
    name one drops kept as it is (no layer is built from it)."""

    mappers: tuple[NameMapper, ...]
    modules: frozenset[str]  # the class's layer patterns (layer numbers `*`)
    fusions: Mapping[str, tuple[str, ...]]

    def built(self, name: str) -> bool:
        pattern = NUMBER.sub(".*", name)
        if pattern in self.modules:
            return True
        parent, _, leaf = pattern.rpartition(".")
        return any(leaf in shards and f"{parent}.{fused}" in self.modules for fused, shards in self.fusions.items())

    def __call__(self, name: str) -> str:
        if self.built(name):
            return name
        for mapper in self.mappers:
            mapped = mapper(name)
            name = name if mapped is None else mapped
        return name


@dataclass(frozen=True)
class MappedRule:
    """A rule (`inner`) compiled over the rewritten list, asked with names in vLLM's spelling; entries it reports
    are the list's own (`origins`: rewritten entry -> the written ones)."""

    inner: object
    spell: Spelling
    origins: Mapping[str, tuple[str, ...]]

    def excludes(self, prefix: str) -> bool:
        return self.inner.excludes(self.spell(prefix))

    def shard_excluded(self, prefix: str) -> bool:
        return self.inner.shard_excluded(self.spell(prefix))

    def used_entries(self, prefixes: Iterable[str]) -> frozenset[str]:
        used = self.inner.used_entries({self.spell(p) for p in prefixes})
        return frozenset(e for u in used for e in self.origins.get(u, (u,)))

    def __getattr__(self, attr: str):
        """The inner rule's optional questions (`names`, `named`, `untargeted`, `fused_refusal`), names spelled as
        vLLM's: present exactly where the inner rule has them (callers test `hasattr`)."""
        if attr.startswith("_") or attr in ("inner", "spell", "origins"):
            raise AttributeError(attr)
        found = getattr(self.inner, attr)
        if attr == "named":
            return lambda test, name: found(test, self.spell(name))
        if attr == "fused_refusal":
            return lambda fused, shards: found(self.spell(fused), tuple(self.spell(s) for s in shards))
        return lambda name: found(self.spell(name))


def spelling(entry: Mapping) -> Spelling:
    """The asked-name spelling of one profile row (its drafter's layers too)."""
    modules = with_drafter(entry)[0]
    return Spelling(tuple(NameMapper.read(d) for d in entry.get("exclusion_mappers", ())), frozenset(modules),
                    {k: tuple(v) for k, v in entry.get("fused", {}).items()})


def mapped_layers(algos: LayerAlgorithms, mappers: tuple[NameMapper, ...]) -> LayerAlgorithms:
    """A MIXED_PRECISION map as WeightsMapper.apply_dict leaves it after each apply_vllm_mapper call: every key mapped as
    a weight name (no `X*` split), a dropped key gone, keys mapped alike one key at the first one's place holding the
    last one's algorithm (a dict comprehension's)."""
    entries = algos.entries
    for mapper in mappers:
        entries = tuple({m: algo for key, algo in entries if (m := mapper(key)) is not None}.items())
    return LayerAlgorithms(entries)


def bind_mappers(declaration: Declaration, family: Architecture, data: list | None, keys: Mapping | None = None) -> Declaration:
    """The declaration whose rules read the list as the release rewrites it for this class (`data`: the row's
    `exclusion_mappers`); unchanged where the class hands its quant config no mapper, or the format says none. Where
    the release maps a MIXED_PRECISION map's keys too (`keys`: its `modelopt_mixed_keys`), each layer resolves from
    the mapped keys under the name vLLM asks (`spell`), the map itself kept as written (the plan edits its keys)."""
    how = getattr(declaration.format, "ENTRY_MAPPING", None)
    built = family.built_quantized
    if not data or how is None or not declaration.quantized or not isinstance(built, BuiltQuantized):
        return declaration
    spell = spelling({**built.entry, "exclusion_mappers": data})
    base = declaration.matcher or declaration.format.rule

    def matcher(entries, targets):
        origins = rewritten(entries, spell.mappers, how)
        spelled = None if targets is None else tuple(rewritten(targets, spell.mappers, "paths"))
        return MappedRule(base(tuple(origins), spelled), spell, origins)
    if declaration.layer_algos is None or (keys or {}).get("mapped") != "apply_dict":
        return replace(declaration, matcher=matcher)
    read, written = mapped_layers(declaration.layer_algos, spell.mappers), declaration.layer_algos.entries
    origins: dict[str, list[str]] = {}
    for key, _ in written:  # each key mapped once: a name's keys are a range of the sorted mapped keys
        mapped = _mapped(key, spell.mappers)
        if mapped is not None:
            origins.setdefault(mapped, []).append(key)
    ordered = sorted(origins)

    def lookup(algos, name):
        return read.lookup(spell(routed_layer(name)), family.fused_layers)

    def keys(name):
        asked = spell(name)
        under = ordered[bisect_left(ordered, asked + "."):bisect_left(ordered, asked + "/")]  # "/" follows "."
        return tuple(k for m in ([asked] if asked in origins else []) + under for k in origins[m])
    return replace(declaration, matcher=matcher, layer_lookup=lookup, layer_keys=keys)


def _mapped(name: str, mappers: tuple[NameMapper, ...]) -> str | None:
    """`name` after each mapper in turn (None: one drops it)."""
    for mapper in mappers:
        name = mapper(name)
        if name is None:
            return None
    return name
