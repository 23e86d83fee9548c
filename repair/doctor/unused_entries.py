"""Exclusion entries that match no module of this model: those no release we ship reads as naming one.

One file serves several runtimes, and each reads its entries its own way: `fix --target vllm==0.32.0,trtllm==1.2.0`
on the compressed-tensors Gemma 4 assistant writes `re:(.*\\.)?pre_projection$` for vLLM (which asks the drafter's
`draft_model.pre_projection`, reachable only by the pattern) and `pre_projection` for TensorRT-LLM before 1.3 (no
`re:` entries; its module-driven loader asks the checkpoint's name). Each is unused to the other runtime, yet not an
entry that matches no module: doctor for either target must not call it so (as named_elsewhere does for names).
"""

from __future__ import annotations

from repair.arch import Architecture, ModuleSpec
from repair.arch.registry import Builds
from repair.doctor.module_loads import module_driven
from repair.errors import BadInput
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule
from repair.io.checkpoint import Checkpoint
from repair.targets.layer_names import named_elsewhere, target_family
from repair.targets.profiles import Target, read_builds, shipped_targets


def unused_entries(ckpt: Checkpoint, declaration: Declaration, modules: dict[str, StoredModule], specs: dict[str, ModuleSpec],
                   family: Architecture, by_stored_name: bool, target: Target | None = None,
                   builds: Builds | None = None) -> dict[str, str | None]:
    """Entry -> the other shipped release that reads it as naming a module (None: none does), for the entries of the
    list the target reads (`declaration`, bound to it) that exclude no module of this model as the target names it
    (`family`; `by_stored_name`: its loader asks the checkpoint's names). Other releases are asked only about the
    entries the target leaves (none, usually); one that refuses an entry (a regex it would hang on) reads it not.
    `builds`: the class each release builds for config.json (read_builds), read here when not given."""
    builds = builds or read_builds(ckpt.config)
    left = _unread(builds, declaration, None, specs or modules, family, by_stored_name)
    out: dict[str, str | None] = dict.fromkeys(left)
    raw = declaration.format.read_declaration(ckpt) if left else None
    for other in shipped_targets() if left else ():
        if target is not None and (other.profile, other.release) == (target.profile, target.release):
            continue
        other_family = target_family(other, ckpt.config, builds)
        try:
            unread = _unread(builds, other.bind(raw, other_family, ckpt.config, other.built(builds)), left, specs or modules, other_family,
                             module_driven(other))
        except BadInput:  # its matcher refuses one of the entries: that release loads no such file
            continue
        still = set(unread)
        out.update({e: other.spec for e in left if e not in still})
        left = unread
        if not left:
            break
    return out


def _unread(builds: Builds, declaration: Declaration, entries: tuple[str, ...] | None, names, family: Architecture,
            by_stored_name: bool) -> tuple[str, ...]:
    """`entries` (None: the whole list, whose compiled rule the declaration keeps) that exclude none of `names` (stored
    or expected modules) as one release reads them: under its runtime names and the names other releases ask
    (named_elsewhere), a fused layer's own name and its shards'."""
    listed = declaration.exclusions if entries is None else entries
    if not listed:
        return ()
    elsewhere = named_elsewhere(builds, names) | (set(names) if by_stored_name else set())
    prefixes = {family.runtime_name(n) for n in names} | {"lm_head"} | elsewhere
    fused_layers = family.scale_groups(set(names) | elsewhere)  # a merged layer's own name is one vLLM asks too
    if entries is not None:  # another release's reading of what the target left: plain entries that cannot name one
        segments = frozenset(s for n in (*prefixes, *(f for f, _ in fused_layers)) for s in n.lower().split("."))
        entries = tuple(e for e in entries if _may_name(e, segments))  # of its names are not compiled one by one
    used = _used(declaration, entries, prefixes)
    # a fused layer's name (qkv_proj) and its shards' (q_proj) both name it: one runtime reads one, another the other
    # (TensorRT-LLM 1.0 only the fused name), and fix --target a,b writes both, never "an entry matching no module"
    # (or, compressed-tensors, a `re:` entry for the fused name, which SGLang asks where no packed mapping splits it)
    # ... also over the names a release asks (SGLang fuses Gemma 4's vision `q_proj.linear` into `self_attn.qkv_proj`)
    used |= {n for fused, shards in fused_layers for n in (fused, *shards)}
    leftover = tuple(p for p in (listed if entries is None else entries) if p not in used)
    if leftover and fused_layers:
        used |= _used(declaration, leftover, {family.runtime_name(fused) for fused, _ in fused_layers})
    return tuple(p for p in listed if p not in used)


def _used(declaration: Declaration, entries: tuple[str, ...] | None, prefixes) -> set[str]:
    """The entries that exclude one of `prefixes` on their own. The format's rule does it in one indexed pass; a
    runtime's own rule is asked entry by entry (a rule compiled per entry), so for another release's reading of a long
    list it is asked about halves first: a half that names none of the prefixes is one compile, not one per entry
    (a list names a layer when one of its entries does). 4,000 entries naming nothing took 9x main's doctor."""
    if declaration.matcher is None or entries is None or hasattr(declaration.rule(entries), "used_entries"):
        return set(declaration.used_entries(prefixes, entries))  # an indexed pass (vLLM's fused tests keep it)
    hit = [p for p in prefixes if declaration.excludes(p, entries)]
    if not hit or len(entries) == 1:
        return set(entries) if hit else set()
    half = len(entries) // 2
    return _used(declaration, entries[:half], hit) | _used(declaration, entries[half:], hit)


PATTERN_SYNTAX = frozenset("*?[]()+{}^$|\\")  # what some runtime reads as glob or regex syntax in an entry


def _may_name(entry: str, segments: frozenset[str]) -> bool:
    """Whether an entry could name a layer whose names' dotted segments (lower case) are `segments`, under any reading
    of a plain entry (exact, dotted suffix, ancestor, a substring either way: vLLM's experts branch): its inner
    segments are whole segments, its outer two are within one. A pattern entry always could."""
    if entry.startswith("re:") or not PATTERN_SYNTAX.isdisjoint(entry):
        return True
    parts = entry.lower().split(".")
    if not all(p in segments for p in parts[1:-1]):
        return False
    return all(end in segments or any(end in s for s in segments) for end in {parts[0], parts[-1]})
