"""repair/targets/data/sglang-<release>.json from an SGLang wheel: the release's rules, and what its model code says.

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    python -m tools.sglang_rules_data /tmp/sgl/sglang-0.5.23-*.whl [...]

Read from the wheel (never imported): every model file's `EntryClass` (the architectures SGLang registers) and the
class-level `packed_modules_mapping` each one has (through its base classes), which is what the quant config's
is_layer_skipped is told (model_loader/loader.py `_get_quantization_config`). The matching rules per release are
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

from tools.sglang_rules_table import COMMON, RULES

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "repair" / "targets" / "data"
MODELS = "sglang/srt/models/"


def _classes(tree: ast.Module) -> tuple[dict, list[str]]:
    """(class -> (base names, literal packed mapping or None), entry class names) of one model file."""
    classes, entries = {}, []
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            mapping = None
            for stmt in node.body:
                if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "packed_modules_mapping" for t in stmt.targets):
                    value = stmt.value  # a literal dict, or another class's (`Qwen3_5ForCausalLM.packed_modules_mapping`)
                    if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
                        mapping = ("same as", value.value.id)
                        continue
                    try:
                        mapping = ast.literal_eval(value)
                    except ValueError:
                        mapping = None
            bases = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
            classes[node.name] = (bases, mapping)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "EntryClass" for t in node.targets):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            entries += [i.id for i in items if isinstance(i, ast.Name)]
    return classes, entries


def packed_mappings(wheel: zipfile.ZipFile) -> tuple[dict[str, dict], list[str]]:
    """(architecture -> its non-empty packed_modules_mapping, every registered architecture). A class name is looked
    up in its own file first (several files define a `Qwen3_5ForCausalLM`), then in the others."""
    files, entries = {}, []
    for name in sorted(wheel.namelist()):
        if name.startswith(MODELS) and name.endswith(".py"):
            found, listed = _classes(ast.parse(wheel.read(name)))
            files[name] = found
            entries += [(a, name) for a in listed]

    def resolve(cls: str, where: str, seen: frozenset = frozenset()) -> dict | None:
        if (cls, where) in seen:
            return None
        place = where if cls in files[where] else next((f for f in files if cls in files[f]), None)
        if place is None:
            return None
        bases, mapping = files[place][cls]
        if isinstance(mapping, tuple):
            return resolve(mapping[1], place, seen | {(cls, where)})
        if mapping is not None:
            return mapping
        return next((m for b in bases if (m := resolve(b, place, seen | {(cls, where)})) is not None), None)

    out = {}
    for arch, where in sorted(set(entries)):
        mapping = resolve(arch, where)
        if isinstance(mapping, dict) and mapping and all(isinstance(v, list) for v in mapping.values()):
            out.setdefault(arch, {k: list(v) for k, v in sorted(mapping.items())})
    return out, sorted({a for a, _ in entries})


def profile(path: Path) -> dict:
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    rules = RULES[release]
    with zipfile.ZipFile(path) as wheel:
        for member, marker in rules["markers"].items():
            if marker not in wheel.read(member).decode():
                raise SystemExit(f"{path.name}: {member} has no {marker!r}; the rules table no longer describes it")
        packed, registered = packed_mappings(wheel)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    body = {**COMMON, **{k: v for k, v in rules.items() if k != "markers"}}
    body["packed_modules_mapping"] = packed
    return {"runtime": "sglang", "release": release,
            "source": {"wheel": path.name, "sha256": digest, "index": "https://pypi.org/project/sglang/",
                       "files": sorted(rules["markers"]), "registered_architectures": len(registered)},
            "rules": body}


def main(argv: list[str]) -> int:
    for arg in argv:
        doc = profile(Path(arg))
        out = DATA / f"sglang-{doc['release']}.json"
        out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)}: {len(doc['rules']['packed_modules_mapping'])} architectures with a packed mapping")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
