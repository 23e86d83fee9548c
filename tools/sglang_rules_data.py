"""repair/targets/data/sglang-<release>.json from an SGLang wheel: the release's rules, and what its model code says.

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    python -m tools.sglang_rules_data /tmp/sgl/sglang-0.5.23-*.whl [...]

Read from the wheel (never imported): every model file's `EntryClass` (the architectures SGLang registers) and the
class-level `packed_modules_mapping` each one has (through its base classes), which is what the quant config's
is_layer_skipped is told (model_loader/loader.py `_get_quantization_config`); the EntryClass names are the release's
`registry`: with any listed name registered, models/registry.py `resolve_model_cls` builds the first one (0.5.23:
models/registry.py:93-114), which repair/arch/registry.py reads. The matching rules per release are
the table RULES below, found by diffing the wheels' quantization/utils.py, modelopt_quant.py and
compressed_tensors/utils.py (see docs/runtime_profiles.md); the tool checks that each rule's marker text is in the
wheel it names, so a table row that no longer describes the wheel fails here, not in a user's run.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

from tools.sglang_rules_table import (COMMON, CONFIG_PACKED, CT_UTILS, NESTED_CONFIG_JSON, NULL_EXCLUSIONS, PLAIN_LAYERS,
                                      RULE_CODE, RULES)

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "repair" / "targets" / "data"
MODELS = "sglang/srt/models/"


def _classes(tree: ast.Module) -> tuple[dict, list[str]]:
    """(class -> (base names, {class attribute: its value's AST}), entry class names) of one model file."""
    classes, entries = {}, []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            attrs = {t.id: stmt.value for stmt in node.body if isinstance(stmt, ast.Assign)
                     for t in stmt.targets if isinstance(t, ast.Name)}
            attrs |= {stmt.name: stmt for stmt in node.body if isinstance(stmt, ast.FunctionDef) and stmt.name in ("__init__", "load_weights")}
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            classes[node.name] = (bases, attrs)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            entries += [i.id for i in items if isinstance(i, ast.Name)]
    return classes, entries


def _unchecked_stacked(load_weights: ast.FunctionDef) -> list[str]:
    """The stacked names (`stacked_params_mapping`'s param names) whose branch indexes params_dict[name] with no
    `name not in params_dict` test first (Qwen3's), so a checkpoint tensor the built layer lacks is a KeyError."""
    names = []
    for node in ast.walk(load_weights):
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "stacked_params_mapping" for t in node.targets):
            try:
                names = sorted({row[0] for row in ast.literal_eval(node.value)})
            except (ValueError, TypeError, IndexError):
                return []
    for loop in ast.walk(load_weights):
        if isinstance(loop, ast.For) and getattr(loop.iter, "id", None) == "stacked_params_mapping":
            for stmt in loop.body:
                test = getattr(stmt, "test", None)
                if isinstance(stmt, ast.If) and isinstance(test, ast.Compare) and isinstance(test.ops[0], ast.NotIn) \
                        and getattr(test.comparators[0], "id", None) == "params_dict":
                    return []
                if any(isinstance(n, ast.Subscript) and getattr(n.value, "id", None) == "params_dict"
                       for n in ast.walk(stmt)):
                    return names
    return []


def packed_mappings(wheel: zipfile.ZipFile) -> tuple[dict[str, dict], list[str], dict[str, dict], dict[str, list]]:
    """(architecture -> its non-empty packed_modules_mapping, every registered architecture, architecture -> {config
    key: the mapping its __init__ adds when the key is set} from CONFIG_PACKED). A class name is looked
    up in its own file first (several files define a `Qwen3_5ForCausalLM`), then in the others; a value that names
    another class's attribute (`qwen3_5.Qwen3_5ForCausalLM.packed_modules_mapping`, `**Other._PACKED_...`) is read
    from that class."""
    files, entries = {}, []
    for name in sorted(wheel.namelist()):
        if name.startswith(MODELS) and name.endswith(".py"):
            found, listed = _classes(ast.parse(wheel.read(name)))
            files[name] = found
            entries += [(a, name) for a in listed]

    def place_of(cls: str, where: str, module: str | None = None) -> str | None:
        if module is not None and f"{MODELS}{module}.py" in files and cls in files[f"{MODELS}{module}.py"]:
            return f"{MODELS}{module}.py"
        return where if cls in files[where] else next((f for f in files if cls in files[f]), None)

    def attribute(cls: str, attr: str, where: str, seen: frozenset, module: str | None = None):
        """The value of `cls.attr` (through its bases), or None when it is not a literal this reader follows."""
        place = place_of(cls, where, module)
        if place is None or (cls, attr, place) in seen:
            return None
        bases, attrs = files[place][cls]
        seen = seen | {(cls, attr, place)}
        if attr in attrs:
            return value(attrs[attr], place, seen)
        return next((v for b in bases if (v := attribute(b, attr, place, seen)) is not None), None)

    def value(node: ast.AST, where: str, seen: frozenset):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return attribute(node.value.id, node.attr, where, seen)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name):
            return attribute(node.value.attr, node.attr, where, seen, module=node.value.value.id)
        if isinstance(node, ast.Dict):
            out = {}
            for key, item in zip(node.keys, node.values):
                got = value(item, where, seen)
                if key is None and isinstance(got, dict):
                    out.update(got)
                elif isinstance(key, ast.Constant) and isinstance(key.value, str) and got is not None:
                    out[key.value] = got
                else:
                    return None
            return out
        try:
            return ast.literal_eval(node)
        except ValueError:
            return None

    def owner(cls: str, where: str, method: str, seen: frozenset = frozenset()) -> tuple[str, ast.AST] | None:
        """(the class whose `method` `cls` runs, its definition)."""
        place = place_of(cls, where)
        if place is None or cls in seen:
            return None
        bases, attrs = files[place][cls]
        if method in attrs:
            return cls, attrs[method]
        return next((o for b in bases if (o := owner(b, place, method, seen | {cls})) is not None), None)

    out, when, unchecked = {}, {}, {}
    for arch, where in sorted(set(entries)):
        mapping = attribute(arch, "packed_modules_mapping", where, frozenset())
        if isinstance(mapping, dict) and mapping and all(isinstance(v, (list, tuple)) for v in mapping.values()):
            out.setdefault(arch, {k: list(v) for k, v in sorted(mapping.items())})
        rule = CONFIG_PACKED.get((owner(arch, where, "__init__") or ("",))[0])
        if rule and rule["marker"] in wheel.read(rule["file"]).decode():
            when[arch] = {rule["when"]: rule["add"]}
        loads = owner(arch, where, "load_weights")
        if loads and (stacked := _unchecked_stacked(loads[1])):
            unchecked[arch] = stacked
    return out, sorted({a for a, _ in entries}), when, unchecked


# find_matched_target's passes, each call of its `matched_target = a or b or c` as the wheel writes it
TARGET_PASSES = {"_find_first_match(layer_name, targets)": "name",
                 "_find_first_match(module.__class__.__name__, targets, True)": "class",
                 "_match_fused_layer(layer_name, targets, fused_mapping)": "fused"}


def target_order(utils: ast.Module) -> list[str]:
    """The order compressed-tensors/utils.py's find_matched_target tries a config-group target in (formats/ct_groups.py
    ORDERS' pass names), read from its `matched_target = ... or ... or ...`; any other shape stops the tool."""
    fn = next((n for n in utils.body if isinstance(n, ast.FunctionDef) and n.name == "find_matched_target"), None)
    found = [n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and getattr(n.targets[0], "id", None) == "matched_target"] if fn else []
    if len(found) != 1 or not isinstance(found[0], ast.BoolOp) or not isinstance(found[0].op, ast.Or):
        raise SystemExit(f"{CT_UTILS}: find_matched_target has no one `matched_target = a or b or c`: read it anew")
    calls = [ast.unparse(v) for v in found[0].values]
    if any(c not in TARGET_PASSES for c in calls):
        raise SystemExit(f"{CT_UTILS}: find_matched_target tries {calls}, not the passes this tool reads: read it anew")
    return [TARGET_PASSES[c] for c in calls]


def rule_code(wheel: zipfile.ZipFile) -> dict[str, str]:
    """Each RULE_CODE unit of a wheel (`file` or `file Class.method`) -> its ast dump ('absent' where it has none)."""
    out = {}
    for member, names in RULE_CODE.items():
        tree = ast.parse(wheel.read(member).decode())
        if names is None:
            out[member] = ast.dump(tree)
            continue
        found = {f"{c.name}.{f.name}": f for c in tree.body if isinstance(c, ast.ClassDef) for f in c.body
                 if isinstance(f, ast.FunctionDef)} | {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
        out |= {f"{member} {n}": ast.dump(found[n]) if n in found else "absent" for n in names}
    return out


def row(release: str, wheels: dict[str, Path]) -> dict:
    """The RULES row of `release`; a `same_as` row is its reference's, checked unit by unit against that wheel."""
    rules = RULES.get(release)
    if rules is None:
        raise SystemExit(f"sglang {release}: no row in tools/sglang_rules_table.py RULES: read its rules anew")
    if "same_as" not in rules:
        return rules
    like = rules["same_as"]
    if like not in wheels:
        raise SystemExit(f"sglang {release} is read as {like}: give {like}'s wheel too, to check their rule code is the same")
    with zipfile.ZipFile(wheels[release]) as a, zipfile.ZipFile(wheels[like]) as b:
        mine, theirs = rule_code(a), rule_code(b)
    differ = sorted(k for k in mine if mine[k] != theirs[k])
    if differ:
        raise SystemExit(f"sglang {release}: {', '.join(differ)} differ from {like}'s: read its rules anew")
    return {k: v.replace(f"SGLang {like} ", f"SGLang {release} ") if isinstance(v, str) else
            {n: t.replace(f"SGLang {like} ", f"SGLang {release} ") for n, t in v.items()} if k == "refused_algorithms"
            else v for k, v in RULES[like].items()}


def profile(path: Path, wheels: dict[str, Path] | None = None) -> dict:
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    rules = row(release, wheels or {release: path})
    with zipfile.ZipFile(path) as wheel:
        for member, marker in rules["markers"].items():
            if marker not in wheel.read(member).decode():
                raise SystemExit(f"{path.name}: {member} has no {marker!r}; the rules table no longer describes it")
        packed, registered, packed_when, unchecked = packed_mappings(wheel)
        text = {n: wheel.read(n).decode() for n in {NESTED_CONFIG_JSON["file"], NULL_EXCLUSIONS["file"],
                                                     *(r["file"] for r in PLAIN_LAYERS.values())} if n in wheel.namelist()}
        order = target_order(ast.parse(wheel.read(CT_UTILS).decode()))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    body = {**COMMON, **{k: v for k, v in rules.items() if k not in ("markers", "loaders_added")}}
    body["loaders"] = {**COMMON["loaders"], **rules.get("loaders_added", {})}  # a release's loaders beside the common
    body["packed_modules_mapping"] = packed
    body["packed_when_config"] = packed_when
    body["nested_config_json_drops_exclusions"] = (NESTED_CONFIG_JSON["methods"] if NESTED_CONFIG_JSON["marker"]
                                                   in text.get(NESTED_CONFIG_JSON["file"], "") else [])
    body["null_exclusions_refused"] = ({m: NULL_EXCLUSIONS["error"] for m in NULL_EXCLUSIONS["methods"]}
                                       if NULL_EXCLUSIONS["marker"] in text.get(NULL_EXCLUSIONS["file"], "") else {})
    body["plain_layers"] = {a: r["layers"] for a, r in PLAIN_LAYERS.items() if r["marker"] in text.get(r["file"], "")}
    body["stacked_unchecked"] = unchecked  # arch -> stacked names whose loader branch raises KeyError on extra tensors
    body["ct_target_order"] = order  # compressed-tensors/utils.py find_matched_target's passes, in its order
    body["registry"] = sorted(set(registered))  # every EntryClass: the names resolve_model_cls takes, first listed one it has
    return {"runtime": "sglang", "release": release,
            "source": {"wheel": path.name, "sha256": digest, "index": "https://pypi.org/project/sglang/",
                       "files": sorted(rules["markers"]), "registered_architectures": len(registered)},
            "rules": body}


# blocks generated from the installed release's own model code, not from its wheel's text, kept when a file is rewritten
# (tools/sglang_built_layers.py: the layers its constructors ask about; tools/sglang_backend.py: its Transformers
# backend gate on every name its registry lacks; tools/sglang_layer_names.py: the names its
# exclusion rules ask for the layers checkpoint modules load into; tools/sglang_expert_scales.py, from the same wheel:
# what its NVFP4 MoE methods keep of a routed expert's gate/up global scales; tools/sglang_moe_schemes.py and
# tools/sglang_moe_overrides.py, from the same wheel: the MoE schemes it refuses, the models' own MoE backend overrides;
# tools/sglang_linear_schemes.py: the Linear schemes it refuses; tools/sglang_sparse24.py: the 2:4 sparse Linears it
# refuses; tools/sglang_layer_drops.py: the modules its model builds in some layers only; tools/sglang_layer_values.py:
# the per-layer config values its build refuses; tools/sglang_registry_renames.py: the names its config classes write)
GENERATED_FROM_INSTALLED = ("built_layers", "layer_names", "transformers_backend", "experts_gate_up_scale_2",
                            "moe_scheme_refused", "moe_backend_overrides", "linear_scheme_refused", "sparse_24_refused",
                            "dropped_in_layers", "layer_values_refused", "registry_renamed",
                            "config_model_types")  # the last from the wheels and their pinned transformers (sglang_config_types)


def main(argv: list[str]) -> int:
    wheels = {re.search(r"sglang-([0-9.]+)-", Path(a).name).group(1): Path(a) for a in argv}
    for arg in argv:
        doc = profile(Path(arg), wheels)
        out = DATA / f"sglang-{doc['release']}.json"
        kept = json.loads(out.read_text(encoding="utf-8"))["rules"] if out.exists() else {}
        for key in GENERATED_FROM_INSTALLED:
            if key in kept:
                doc["rules"][key] = kept[key]
        out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)}: {len(doc['rules']['packed_modules_mapping'])} architectures with a packed mapping")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
