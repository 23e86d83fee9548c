"""The published checkpoint names of a class whose hf_to_vllm_mapper renames them, learned by inverting the mapper on
the names vLLM's own load_weights takes (run in .venv-vllm).

vLLM's WeightsMapper (model_executor/models/utils.py `_map_name_with_shard`) maps a published name through its
regex, substring, stacked, prefix and suffix maps in that order (read from the release's own method: forward_map). A vLLM name is sent back through each map in reverse
order, every inverse applied where it fits (a prefix map's new prefix, a substring map's new text at each place it
occurs, a regex map whose replacement template the name fits, its groups put back into the pattern's own text). The
inverse counts only where it is proven on that name: the mapper (its stacked map aside: own_checkpoint already writes a
fused layer's shards under the names stacked) sends the one candidate back to the vLLM name. A name with no candidate,
or with two, or two names with one published name, is no layout to learn: NoConfig with the reason. So is a class
whose own load_weights hands the loader a stream it renamed in code (telechat2.py's `_split_key_value`: the published
`key_value` is split into `key` / `value` before the mapper sees them), since no mapper records that rename.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap

try:
    from re import _parser as sre_parse  # Python 3.11+
except ImportError:  # pragma: no cover - older Pythons
    import sre_parse  # type: ignore[no-redef]

from vllm_profile_configs import NoConfig

NOT_INVERTIBLE = ("no checkpoint layout to learn: transformers has no class that writes its names, and vLLM's "
                  "hf_to_vllm_mapper is not invertible on the names its load_weights takes")
CODE_RENAMED = ("no checkpoint layout to learn: transformers has no class that writes its names, and vLLM's own "
                "load_weights renames them in code no mapper records")
_GROUP_REF = re.compile(r"\\(\d+)|\\g<(\w+)>")
# the order WeightsMapper._map_name_with_shard applies its maps in (utils.py; 0.28, 0.30, 0.32): candidates() undoes
# them last to first
MAP_ORDER = ("orig_to_new_renaming", "orig_to_new_regex", "orig_to_new_substr", "orig_to_new_stacked",
             "orig_to_new_prefix", "orig_to_new_suffix")


def renaming_maps(mapper) -> dict:
    """The mapper's maps that rename (anything but stacking shards, or dropping names: a value that is not None)."""
    if mapper is None:
        return {}
    return {k: v for k, v in vars(mapper).items() if k != "orig_to_new_stacked" and v
            and (not isinstance(v, dict) or any(x is not None for x in v.values()))}


def published_names(model, names: list[str]) -> dict[str, str]:
    """vLLM name -> the published name its class's mapper maps onto it, for every name (NoConfig where not proven)."""
    mapper = type(model).hf_to_vllm_mapper
    if getattr(mapper, "orig_to_new_renaming", None):
        raise NoConfig(f"{NOT_INVERTIBLE}: orig_to_new_renaming (WeightRenaming) is not inverted here")
    renamed = code_renamed_stream(model)
    if renamed:
        raise NoConfig(f"{CODE_RENAMED}: {renamed}")
    forward = forward_map(dataclasses.replace(mapper, orig_to_new_stacked={}))
    out: dict[str, str] = {}
    for name in names:
        found = sorted(c for c in candidates(mapper, name) if forward(c) == name)
        if len(found) != 1:
            raise NoConfig(f"{NOT_INVERTIBLE}: {name} is mapped from {found or 'no name'}")
        out[name] = found[0]
    seen: dict[str, str] = {}
    for name, published in out.items():
        if published in seen:
            raise NoConfig(f"{NOT_INVERTIBLE}: {seen[published]} and {name} are both mapped from {published}")
        seen[published] = name
    return out


def forward_map(mapper):
    """The mapper's own one-name map (`map_name`, public since 0.32; `_map_name` in 0.28/0.30), once its
    _map_name_with_shard is read (ast) to apply the maps in the order candidates() inverts (MAP_ORDER: the same in
    0.28, 0.30 and 0.32); a release applying them in another order stops the tool: read its mapper anew."""
    method = type(mapper)._map_name_with_shard
    tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
    read = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr.startswith("orig_to_new_")
            and isinstance(n.value, ast.Name) and n.value.id == "self"]
    order = list(dict.fromkeys(n.attr for n in sorted(read, key=lambda n: (n.lineno, n.col_offset))))
    if order != list(MAP_ORDER):
        raise SystemExit(f"{type(mapper).__qualname__}._map_name_with_shard applies {order}, not {list(MAP_ORDER)}: "
                         "tools/vllm_mapper_inverse.py candidates() does not invert this release's mapper")
    return getattr(mapper, "map_name", None) or mapper._map_name


def candidates(mapper, name: str) -> set[str]:
    """Every name the mapper's maps, each inverted where it fits, in reverse order, give `name` back from."""
    found = {name}
    for old, new in reversed(list((mapper.orig_to_new_suffix or {}).items())):
        if new is not None:
            found = {c[: -len(new)] + old if new and c.endswith(new) else c for c in found}
    for old, new in reversed(list((mapper.orig_to_new_prefix or {}).items())):
        if new is not None:
            found = {old + c[len(new):] if c.startswith(new) else c for c in found}
    for old, new in reversed(list((mapper.orig_to_new_substr or {}).items())):
        if new:
            found = {x for c in found for x in (substr_inverses(c, old, new) or {c})}
    for regex, new in reversed(list((mapper.orig_to_new_regex or {}).items())):
        if new is not None:
            found = {x for c in found for x in (regex_inverses(regex, new, c) or {c})}
    return found


def substr_inverses(name: str, old: str, new: str) -> set[str]:
    """`name` with one occurrence of `new` put back to `old` (the forward map replaced the first `old`), each place."""
    return {name[:i] + old + name[i + len(new):] for i in range(len(name)) if name.startswith(new, i)}


def regex_inverses(regex, template: str, name: str) -> set[str]:
    """The names `regex`'s substitution by `template` turns into `name`: the template's text matched against the name
    (each group reference, first lazily then greedily), each group's text put back into the pattern's own text.
    Empty where the template does not fit the name or the pattern holds more than literals, anchors and groups."""
    parts, groups, at = [], [], 0
    for m in _GROUP_REF.finditer(template):
        if "\\" in template[at:m.start()]:
            return set()
        group = m.group(1) or m.group(2)
        parts.append(re.escape(template[at:m.start()]))
        parts.append(f"(?P=g{group})" if group in groups else f"(?P<g{group}>{{any}})")
        groups.append(group)
        at = m.end()
    if "\\" in template[at:]:
        return set()
    parts.append(re.escape(template[at:]))
    out = set()
    for any_text in (".+?", ".+"):
        m = re.fullmatch("".join(parts).replace("{any}", any_text), name)
        if m is not None:
            built = from_pattern(regex.pattern, {g: m.group(f"g{g}") for g in groups})
            if built is not None and regex.search(built) and regex.sub(template, built) == name:
                out.add(built)
    return out


def from_pattern(pattern: str, values: dict[str, str]) -> str | None:
    """The text `pattern` matches with each group holding its value: literals, anchors and groups only (None else,
    or where a group has no value: its text would be lost)."""
    try:
        tree = sre_parse.parse(pattern)
    except re.error:
        return None
    names = {str(v): str(k) for k, v in tree.state.groupdict.items()}
    return _text(tree, values, names)


def _text(items, values: dict[str, str], names: dict[str, str]) -> str | None:
    out = []
    for op, arg in items:
        if op is sre_parse.LITERAL:
            out.append(chr(arg))
        elif op is sre_parse.AT and arg in (sre_parse.AT_BEGINNING_STRING, sre_parse.AT_END_STRING,
                                            sre_parse.AT_BEGINNING, sre_parse.AT_END):
            continue
        elif op is sre_parse.SUBPATTERN and arg[0] is not None:
            value = values.get(str(arg[0]), values.get(names.get(str(arg[0]), "")))
            if value is None:
                return None
            out.append(value)
        elif op is sre_parse.SUBPATTERN:
            inner = _text(arg[3], values, names)
            if inner is None:
                return None
            out.append(inner)
        else:
            return None
    return "".join(out)


def code_renamed_stream(model) -> str | None:
    """`Class.load_weights (file:line)` of the first load_weights among the model's modules that hands a loader's
    load_weights a stream of its own making (a call on its weights, not the weights it was given), else None."""
    seen = set()
    for module in model.modules():
        function = getattr(type(module), "load_weights", None)
        if function is None or function in seen:
            continue
        seen.add(function)
        try:
            source, first = inspect.getsourcelines(function)
        except (OSError, TypeError):
            continue
        tree = ast.parse(textwrap.dedent("".join(source)))
        for node in ast.walk(tree):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load_weights"
                    and node.args and isinstance(node.args[0], ast.Call)):
                where = f"{inspect.getsourcefile(function).rpartition('/models/')[2]}:{first + node.lineno - 1}"
                return f"{function.__qualname__} ({where}) passes {ast.unparse(node.args[0])}"
    return None
