"""Exclusion entries that match no module of this model: those no release we ship reads as naming one.

One file serves several runtimes, and each reads its entries its own way: `fix --target vllm==0.32.0,trtllm==1.2.0`
on the compressed-tensors Gemma 4 assistant writes `re:(.*\\.)?pre_projection$` for vLLM (which asks the drafter's
`draft_model.pre_projection`, reachable only by the pattern) and `pre_projection` for TensorRT-LLM before 1.3 (no
`re:` entries; its module-driven loader asks the checkpoint's name). Each is unused to the other runtime, yet not an
entry that matches no module: doctor for either target must not call it so (as named_elsewhere does for names).
"""

from __future__ import annotations

from repair.arch import Architecture, ModuleSpec
from repair.doctor.module_loads import module_driven
from repair.errors import BadInput
from repair.formats.base import Declaration
from repair.formats.modules import StoredModule
from repair.io.checkpoint import Checkpoint
from repair.targets.layer_names import named_elsewhere, target_family
from repair.targets.profiles import Target, shipped_targets


def unused_entries(ckpt: Checkpoint, declaration: Declaration, modules: dict[str, StoredModule], specs: dict[str, ModuleSpec],
                   family: Architecture, by_stored_name: bool, target: Target | None = None) -> dict[str, str | None]:
    """Entry -> the other shipped release that reads it as naming a module (None: none does), for the entries of the
    list the target reads (`declaration`, bound to it) that exclude no module of this model as the target names it
    (`family`; `by_stored_name`: its loader asks the checkpoint's names). Other releases are asked only about the
    entries the target leaves (none, usually); one that refuses an entry (a regex it would hang on) reads it not."""
    left = _unread(ckpt.config, declaration, None, specs or modules, family, by_stored_name)
    out: dict[str, str | None] = dict.fromkeys(left)
    raw = declaration.format.read_declaration(ckpt) if left else None
    for other in shipped_targets() if left else ():
        if target is not None and (other.profile, other.release) == (target.profile, target.release):
            continue
        other_family = target_family(other, ckpt.config)
        try:
            unread = _unread(ckpt.config, other.bind(raw, other_family, ckpt.config), left, specs or modules, other_family,
                             module_driven(other))
        except BadInput:  # its matcher refuses one of the entries: that release loads no such file
            continue
        out.update({e: other.spec for e in left if e not in unread})
        left = unread
        if not left:
            break
    return out


def _unread(config: dict | None, declaration: Declaration, entries: tuple[str, ...] | None, names, family: Architecture,
            by_stored_name: bool) -> tuple[str, ...]:
    """`entries` (None: the whole list, whose compiled rule the declaration keeps) that exclude none of `names` (stored
    or expected modules) as one release reads them: under its runtime names and the names other releases ask
    (named_elsewhere), a fused layer's own name and its shards'."""
    listed = declaration.exclusions if entries is None else entries
    if not listed:
        return ()
    elsewhere = named_elsewhere(config, names) | (set(names) if by_stored_name else set())
    prefixes = {family.runtime_name(n) for n in names} | {"lm_head"} | elsewhere
    used = set(declaration.used_entries(prefixes, entries))  # one pass over the names, not entries x names (the format's rule)
    # a fused layer's name (qkv_proj) and its shards' (q_proj) both name it: one runtime reads one, another the other
    # (TensorRT-LLM 1.0 only the fused name), and fix --target a,b writes both, never "an entry matching no module"
    # (or, compressed-tensors, a `re:` entry for the fused name, which SGLang asks where no packed mapping splits it)
    # ... also over the names a release asks (SGLang fuses Gemma 4's vision `q_proj.linear` into `self_attn.qkv_proj`)
    fused_layers = family.fused_groups(set(names) | elsewhere)
    used |= {n for fused, shards in fused_layers for n in (fused, *shards)}
    leftover = tuple(p for p in listed if p not in used)
    if leftover and fused_layers:
        used |= declaration.used_entries({family.runtime_name(fused) for fused, _ in fused_layers}, leftover)
    return tuple(p for p in listed if p not in used)
