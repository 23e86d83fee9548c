"""The `config_model_types` block of repair/targets/data/sglang-<release>.json: the model_types its config reader knows.

    python -m tools.sglang_config_types /tmp/sglwheels/0.5.9/sglang-0.5.9-*.whl [...]   (rewrites each release's file)

SGLang reads config.json through transformers' AutoConfig (0.5.9-0.5.23 sglang/srt/utils/hf_transformers_utils.py
get_config), after registering its own config classes (`_CONFIG_REGISTRY`); a model_type neither knows stops the
server while reading the config, in transformers' words (configuration_auto.py AutoConfig.from_pretrained: "The
checkpoint you are trying to load has model type ..."), before any layer or registry is asked; get_config catches that
error only for the model types it names (0.5.9: `deepseek_v32`, loaded its own way). Read from the wheels, never
installed: the transformers release the SGLang wheel pins (its METADATA; that wheel is fetched with `pip download
--no-deps` into TRANSFORMERS_WHEELS), its CONFIG_MAPPING_NAMES keys (configuration_auto.py, and auto_mappings.py where
a release keeps them there) and the raise's text; SGLang's registered classes' `model_type` (srt/configs/*.py).
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "repair" / "targets" / "data"
TRANSFORMERS_WHEELS = Path(os.environ.get("TRANSFORMERS_WHEELS", "/tmp/sglwheels/transformers"))  # a folder per release
GET_CONFIG = ("sglang/srt/utils/hf_transformers_utils.py", "sglang/srt/utils/hf_transformers/common.py",
              "sglang/srt/utils/hf_transformers/config.py")  # 0.5.9/0.5.10; 0.5.11+ split it
AUTO = ("transformers/models/auto/configuration_auto.py", "transformers/models/auto/auto_mappings.py")
MARKER = "does not recognize this architecture"
REGISTERS_CONFIGS = ("AutoConfig", "CONFIG_MAPPING")  # `.register(model_type, class)` on either adds a model type


def pinned_transformers(wheel: zipfile.ZipFile) -> str:
    metadata = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    return re.search(r"^Requires-Dist: transformers==([0-9.]+)", wheel.read(metadata).decode(), re.M).group(1)


def _keys(node: ast.AST) -> set[str]:
    """String keys of every dict literal, and first items of every 2-tuple list, inside `node`."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Dict):
            out |= {k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(n, ast.Tuple) and len(n.elts) == 2 and isinstance(n.elts[0], ast.Constant) and isinstance(n.elts[0].value, str):
            out.add(n.elts[0].value)
    return out


def transformers_facts(path: Path) -> tuple[set[str], str]:
    """(CONFIG_MAPPING_NAMES' model types, AutoConfig's refusal with `{model_type}`) of one transformers wheel."""
    types, error = set(), None
    with zipfile.ZipFile(path) as wheel:
        for member in (m for m in AUTO if m in wheel.namelist()):
            tree = ast.parse(wheel.read(member).decode())
            for node in ast.walk(tree):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
                if any(getattr(t, "id", None) == "CONFIG_MAPPING_NAMES" for t in targets) and node.value is not None:
                    types |= _keys(node.value)
                if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "update" \
                        and getattr(node.func.value, "id", None) == "CONFIG_MAPPING_NAMES":
                    types |= _keys(node)
                if isinstance(node, ast.JoinedStr) and MARKER in "".join(str(getattr(v, "value", "")) for v in node.values):
                    error = "".join(v.value if isinstance(v, ast.Constant) else "{model_type}" for v in node.values)
    if not types or error is None:
        raise SystemExit(f"{path.name}: no CONFIG_MAPPING_NAMES or no AutoConfig refusal found; read it anew")
    return types, error


def _names(node: ast.AST | None) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} if node is not None else set()


def _registrations(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(model types, class names) one module registers with AutoConfig/CONFIG_MAPPING.register: a constant first
    argument, the class passed (`register(Cls.model_type, Cls)`), the classes a loop around the call walks over
    (0.5.23 muse_spark.py:253-259, inkling.py:431-437)."""
    types, classes = set(), set()
    calls = lambda node: [c for c in ast.walk(node) if isinstance(c, ast.Call) and getattr(c.func, "attr", None) == "register"
                          and getattr(c.func.value, "id", None) in REGISTERS_CONFIGS and len(c.args) >= 2]
    for call in calls(tree):
        first = call.args[0]
        types |= {first.value} if isinstance(first, ast.Constant) and isinstance(first.value, str) else set()
        classes |= _names(call.args[1]) | _names(first)
    for loop in (n for n in ast.walk(tree) if isinstance(n, ast.For) and calls(n)):
        classes |= _names(loop.iter)
    return types, classes


def sglang_facts(wheel: zipfile.ZipFile) -> tuple[set[str], set[str]]:
    """(model types of SGLang's own registered config classes, model types get_config loads after AutoConfig refused):
    `_CONFIG_REGISTRY`'s classes (a list, 0.5.9/0.5.10, or a dict built from one, 0.5.11+), its keys set one by one
    (0.5.12: `_CONFIG_REGISTRY["deepseek_v4"] = ...`), the classes its `update` adds (0.5.23: a tuple of DeepSeek-V4.1's,
    common.py:225), and what the config modules register with AutoConfig themselves (0.5.23 qwen3_asr.py:168)."""
    trees = [ast.parse(wheel.read(m).decode()) for m in GET_CONFIG if m in wheel.namelist()]
    modules = [ast.parse(wheel.read(n).decode()) for n in wheel.namelist()
               if n.startswith("sglang/srt/configs/") and n.endswith(".py")]
    classes, own, caught = set(), set(), set()
    for node in (n for t in trees for n in ast.walk(t) if isinstance(n, (ast.Assign, ast.AnnAssign))):
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
            if getattr(target, "id", None) == "_CONFIG_REGISTRY" and node.value is not None:
                classes |= {n for n in _names(node.value) if n.endswith("Config")}
            if isinstance(target, ast.Subscript) and getattr(target.value, "id", None) == "_CONFIG_REGISTRY" \
                    and isinstance(target.slice, ast.Constant) and isinstance(target.slice.value, str):
                own.add(target.slice.value)
    for call in (n for t in trees for n in ast.walk(t) if isinstance(n, ast.Call) and getattr(n.func, "attr", None) == "update"
                 and getattr(n.func.value, "id", None) == "_CONFIG_REGISTRY"):
        classes |= _names(call)
    if not classes:
        raise SystemExit(f"no _CONFIG_REGISTRY in {GET_CONFIG}: read get_config anew")
    for types, named in map(_registrations, (*trees, *modules)):
        own, classes = own | types, classes | named
    tuples = {t.id: _names(s.value) for m in modules for s in m.body if isinstance(s, ast.Assign)
              and isinstance(s.value, (ast.Tuple, ast.List)) for t in s.targets if isinstance(t, ast.Name)}
    classes |= {c for name in classes for c in tuples.get(name, ())}
    for cls in (c for m in modules for c in ast.walk(m) if isinstance(c, ast.ClassDef) and c.name in classes):
        own |= {s.value.value for s in cls.body if isinstance(s, (ast.Assign, ast.AnnAssign)) and isinstance(s.value, ast.Constant)
                and isinstance(s.value.value, str) and any(getattr(t, "id", None) == "model_type"
                                                           for t in (s.targets if isinstance(s, ast.Assign) else [s.target]))}
    for get_config in (f for t in trees for f in t.body if isinstance(f, ast.FunctionDef) and f.name == "get_config"):
        caught |= {n.left.value for n in ast.walk(get_config) if isinstance(n, ast.Compare) and isinstance(n.left, ast.Constant)
                   and isinstance(n.left.value, str) and any(isinstance(c, ast.Call) and getattr(c.func, "id", None) == "str"
                                                             for c in n.comparators)}
    return own, caught


def facts(path: Path) -> dict:
    with zipfile.ZipFile(path) as wheel:
        pinned = pinned_transformers(wheel)
        own, caught = sglang_facts(wheel)
    folder = TRANSFORMERS_WHEELS / pinned
    if not list(folder.glob("transformers-*.whl")):
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"transformers=={pinned}", "-d", str(folder)],
                       check=True)
    types, error = transformers_facts(next(folder.glob("transformers-*.whl")))
    return {"transformers": pinned, "known": sorted(types | own | caught), "error": f"ValueError: {error}",
            "where": f"sglang/srt/utils get_config: transformers {pinned}'s AutoConfig.from_pretrained (configuration_auto.py), "
                     f"after SGLang's own config classes ({len(own)}) are registered"}


def main(argv: list[str]) -> int:
    for arg in argv:
        release = re.search(r"sglang-([0-9.]+)-", Path(arg).name).group(1)
        path = DATA / f"sglang-{release}.json"
        doc = json.loads(path.read_text(encoding="utf-8"))
        doc["rules"]["config_model_types"] = facts(Path(arg))
        path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"{path.name}: transformers {doc['rules']['config_model_types']['transformers']}, "
              f"{len(doc['rules']['config_model_types']['known'])} model types")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
