"""Stored modules vLLM builds as ONE layer in one scheme, so a repair turns them BF16 together or not at all.

Two kinds, from vLLM 0.32: the shards of a fused layer (the family's `packed_modules_mapping`, e.g.
q/k/v_proj -> qkv_proj, gate/up_proj -> gate_up_proj), which resolve to the algorithm of the shards
still declared; and the routed experts of one MoE layer (`...mlp.experts.N.*` -> `...mlp.experts`),
where one expert named in the exclusion list excludes them all (quant_utils.is_layer_skipped). One
member back to BF16 beside quantized ones is a layer vLLM cannot load. `fix --target` takes the
whole layer; an explicit recipe that splits one is refused.
"""

from __future__ import annotations

from collections import defaultdict

from repair.errors import BadInput, UsageError
from repair.formats.base import routed_layer
from repair.formats.modules import StoredModule
from repair.planning.recipe import Action

BF16_ACTIONS = (Action.DEQUANTIZE, Action.TAKE_ORIGINAL)
_SETTLED = BF16_ACTIONS + (Action.DROP,)


class Layers:
    """The runtime layer of each stored module that shares one with others."""

    def __init__(self, modules: dict[str, StoredModule], fused: dict[str, tuple[str, ...]], runtime_name=None):
        """`runtime_name`: checkpoint module -> the name the runtime groups it under (a release's own layer names:
        Gemma 4's vision `self_attn.q_proj.linear` is SGLang's shard `self_attn.q_proj`); default the module's own."""
        self.modules = modules
        self.runtime_name = runtime_name
        self.stored = {runtime_name(n): n for n in modules} if runtime_name is not None else None
        self.routed: dict[str, list[str]] = defaultdict(list)
        for name in modules:
            if routed_layer(name) != name:
                self.routed[routed_layer(name)].append(name)
        self.shard_of = {shard: (layer, shards) for layer, shards in fused.items() for shard in shards}

    def members(self, name: str) -> tuple[str, list[str]]:
        """(the runtime layer's name, its stored members) for `name`; members is [name] alone when it has none."""
        routed = routed_layer(name)
        if routed != name:
            return routed, self.routed[routed]
        parent, _, leaf = (name if self.runtime_name is None else self.runtime_name(name)).rpartition(".")
        if leaf not in self.shard_of:
            return name, [name]
        layer, shards = self.shard_of[leaf]
        names = [f"{parent}.{s}" for s in shards]
        if self.stored is None:
            return f"{parent}.{layer}", [n for n in names if n in self.modules]
        return f"{parent}.{layer}", [self.stored[n] for n in names if n in self.stored]

    def unstored(self, name: str) -> tuple[str, list[str]]:
        """(the fused layer, its shards as the release names them that no stored module loads into) for a module the
        release's own layer names rename (Gemma 4's vision `q_proj.linear`): it asks its exclusions about every shard."""
        renamed = self.runtime_name(name) if self.runtime_name is not None else name
        parent, _, leaf = renamed.rpartition(".")
        if renamed == name or leaf not in self.shard_of:
            return name, []
        layer, shards = self.shard_of[leaf]
        return f"{parent}.{layer}", [f"{parent}.{s}" for s in shards if f"{parent}.{s}" not in self.stored]

    def left_quantized(self, name: str, bf16: set[str]) -> list[str]:
        """Members of `name`'s runtime layer that stay quantized when the modules in `bf16` become BF16."""
        return [n for n in self.members(name)[1] if n not in bf16 and self.modules[n].is_quantized]


def complete(names: tuple[str, ...], layers: Layers, where: str = "") -> tuple[str, ...]:
    """`names` (modules a target dequantizes) with every quantized member of their runtime layers added; one line (`where`:
    the checkpoint and the target) for a
    fused layer the checkpoint lacks a shard of, which no exclusion entry makes BF16 whole."""
    for name in names:
        if (found := layers.unstored(name))[1]:
            raise BadInput(f"{where} builds {found[0]} as one fused layer and asks its exclusions about each "
                           f"shard, but {', '.join(found[1])} is not stored (no module loads into it), so no entry makes "
                           f"the layer BF16 whole beside {name}; nothing was written; re-export the checkpoint with that shard")
    chosen = set(names)
    extra = [n for name in names for n in layers.left_quantized(name, chosen)]
    return tuple(dict.fromkeys(names + tuple(extra)))


def refuse_split_layers(actions: dict[str, Action], layers: Layers, where: str) -> None:
    """One line for a recipe that turns part of a runtime layer BF16 and leaves the rest quantized."""
    settled = {n for n, a in actions.items() if a in _SETTLED}
    for name, action in actions.items():
        left = layers.left_quantized(name, settled) if action in BF16_ACTIONS else []
        if not left:
            continue
        layer, _ = layers.members(name)
        routed = routed_layer(name) != name
        kind = (f"vLLM builds the routed experts of {layer} in one scheme (one expert excluded excludes them all)"
                if routed else f"vLLM loads {layer} as one fused layer in one scheme")
        add = f'"{layer}.*"' if routed else ", ".join(left)
        raise UsageError(f"{where}: the recipe turns {name} BF16 but leaves {len(left)} module(s) of its layer quantized ({left[0]}, ...): "
                         f"{kind}, so the output could not load; {action.value} them together (add {add} to the rule)")
