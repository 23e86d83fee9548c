#!/usr/bin/env python
"""TensorRT-LLM's PyTorch-backend model registry, read from the release's own source with `ast` (nothing imported).

    trtllm_registry.py --mirror GITDIR [--write]      a git directory of NVIDIA/TensorRT-LLM holding the release tags
    trtllm_registry.py --tree DIR --file F [--write]  one release's source folder (holding tensorrt_llm/, e.g. an
                                                      unpacked wheel) for data file F (its version.py is recorded)

How the release picks a class (tensorrt_llm/_torch/models/modeling_auto.py, `AutoModelForCausalLM.from_config`, from
1.0 to main): it takes `config.pretrained_config.architectures[0]` and looks it up in the table `register_auto_model`
fills (modeling_utils.py: `MODEL_CLASS_MAPPING`, later behind `get_registered_model_class`); no later listed name is
asked, and there is no Transformers fallback: an unknown name raises `ValueError(f"Unknown architecture for
AutoModelForCausalLM: {...architectures[0]}")` before any layer is built. A config with `draft_vocab_size` (an EAGLE-3
draft's) is asked as "EAGLE3" + the name (later releases first cut "Eagle3" from it). The table is filled as
`tensorrt_llm._torch.models` imports its model modules (its __init__.py's relative imports and theirs); a release with
the lazy zoo index (`_arch_index.py`, MODEL_ARCH_TO_MODULE) imports the module the index names for the asked name.

What is written into each trtllm data file: `rules.registry` (every name a `register_auto_model("<literal>")` call in
those modules registers), `rules.registry_rule` (the first-name rule, its error and the draft rename, read from
modeling_auto.py's own code), and `source.registry` (the tag, the commit it resolved to, the files read). A release
whose source cannot be read is left as it is, and said so; nothing here is typed by hand. Imports nothing from `repair`.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "repair" / "targets" / "data"
PACKAGE = "tensorrt_llm/_torch/models"
AUTO = f"{PACKAGE}/modeling_auto.py"
INDEX = f"{PACKAGE}/_arch_index.py"
# the release each shipped rules file stands for (tests/data/trtllm/PROVENANCE.md, "Release <-> rule version"): its
# git tag upstream. 1.3 and 1.4 were not final when their rules were read: the newest published tag of each line.
RELEASES = {"trtllm-1.0.json": "v1.0.0", "trtllm-1.1.json": "v1.1.0", "trtllm-1.3.json": "v1.3.0rc29",
            "trtllm-1.4.json": "v1.4.0rc1"}
MAX_FILE = 8 << 20  # bytes of one source file read
MAX_MODULES = 2000  # modules followed from the package's imports
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")  # a module or class name as the release can spell it


class Unreadable(Exception):
    """The release's source does not hold what the registry is read from (a path, a tag, the expected code)."""


@dataclass(frozen=True)
class GitSource:
    """Files at one commit of a git mirror, read with `git show` (the mirror is data: nothing in it runs)."""

    mirror: Path
    commit: str

    @classmethod
    def at(cls, mirror: Path, tag: str) -> GitSource:
        if not re.fullmatch(r"v[0-9][0-9A-Za-z.]{0,30}", tag):
            raise Unreadable(f"not a release tag: {tag!r}")
        out = _git(mirror, "rev-parse", "--verify", "--quiet", f"refs/tags/{tag}^{{commit}}")
        if out is None or not re.fullmatch(r"[0-9a-f]{40}", out.strip()):
            raise Unreadable(f"{mirror} has no tag {tag}")
        return cls(mirror, out.strip())

    def read(self, path: str) -> str | None:
        return _git(self.mirror, "cat-file", "-p", f"{self.commit}:{path}")

    def where(self) -> dict:
        return {"commit": self.commit}


@dataclass(frozen=True)
class TreeSource:
    """Files under one release's source folder (holding tensorrt_llm/), such as an unpacked wheel."""

    root: Path

    def read(self, path: str) -> str | None:
        file = (self.root / path).resolve()
        if not file.is_relative_to(self.root.resolve()) or not file.is_file() or file.stat().st_size > MAX_FILE:
            return None
        return file.read_text(encoding="utf-8", errors="replace")

    def where(self) -> dict:
        text = self.read("tensorrt_llm/version.py") or ""
        found = re.search(r"""__version__\s*=\s*["']([0-9A-Za-z.+]{1,40})["']""", text)
        return {"version_py": found.group(1) if found else None}


def _git(mirror: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", f"--git-dir={mirror}", *args], capture_output=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0 or len(done.stdout) > MAX_FILE:
        return None
    return done.stdout.decode("utf-8", errors="replace")


def parse(text: str, path: str) -> ast.Module:
    try:
        return ast.parse(text, filename=path)
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
        raise Unreadable(f"{path} does not parse: {type(e).__name__}") from None


def relative_imports(tree: ast.Module) -> list[str]:
    """The package's own modules a module imports (`from .modeling_x import ...`, `from . import modeling_x`)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module.split(".")[0]] if node.module else [a.name for a in node.names]
            out += [n for n in names if NAME.fullmatch(n)]
    return out


def registrations(tree: ast.Module) -> tuple[list[str], int]:
    """(names, unread): every `register_auto_model("<literal>")` call (as a decorator or called), and how many such
    calls name their architecture with something other than a string literal (not followed: said, never guessed)."""
    names, unread = [], 0
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
        if called != "register_auto_model":
            continue
        first = node.args[0] if node.args else next((k.value for k in node.keywords if k.arg == "name"), None)
        if isinstance(first, ast.Constant) and isinstance(first.value, str) and NAME.fullmatch(first.value):
            names.append(first.value)
        else:
            unread += 1
    return names, unread


def module_path(source, module: str) -> str | None:
    """The file of a module of the package: modeling_x.py, or modeling_x/__init__.py."""
    for path in (f"{PACKAGE}/{module}.py", f"{PACKAGE}/{module}/__init__.py"):
        if source.read(path) is not None:
            return path
    return None


def index_modules(source) -> dict[str, str] | None:
    """The lazy zoo's MODEL_ARCH_TO_MODULE (name -> module), None where the release has no such index."""
    text = source.read(INDEX)
    if text is None:
        return None
    for node in parse(text, INDEX).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "MODEL_ARCH_TO_MODULE" for t in node.targets)
                and isinstance(node.value, ast.Dict)):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant) and isinstance(k.value, str)
                    and isinstance(v.value, str) and NAME.fullmatch(v.value)}
    raise Unreadable(f"{INDEX} holds no MODEL_ARCH_TO_MODULE table")


@dataclass
class Read:
    registry: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)
    unread: dict[str, int] = field(default_factory=dict)


def registry(source) -> Read:
    """Every name the release's model table holds once `tensorrt_llm._torch.models` is imported (eager releases: its
    modules and the package modules they import, followed to the end) or, with the lazy index, once the module the
    index names for a name is imported (a name whose indexed module does not register it is left out)."""
    read, index = Read(), index_modules(source)
    start = sorted(set(index.values())) if index is not None else ["__init__"]
    queue, seen, by_module = list(start), set(), {}
    while queue and len(seen) < MAX_MODULES:
        module = queue.pop(0)
        if module in seen:
            continue
        seen.add(module)
        path = module_path(source, module)
        if path is None:
            continue
        tree = parse(source.read(path), path)
        names, unread = registrations(tree)
        by_module[module] = names
        read.files.append(path)
        if unread:
            read.unread[path] = unread
        if path.count("/") == PACKAGE.count("/") + 1:  # a subpackage's relative imports are its own: not followed
            queue += [m for m in relative_imports(tree) if m not in seen]
    if index is not None:
        read.registry = {n for n, m in index.items() if n in by_module.get(m, ())}
        read.files.append(INDEX)
    else:
        read.registry = {n for names in by_module.values() for n in names}
    if not read.registry:
        raise Unreadable(f"no register_auto_model call read under {PACKAGE}")
    return read


def rule(source) -> dict:
    """The first-name rule as modeling_auto.py's AutoModelForCausalLM codes it: `architectures[0]` asked, its
    ValueError's f-string (the name as `{architecture}`), and the draft rename where the release has it."""
    text = source.read(AUTO)
    if text is None:
        raise Unreadable(f"no {AUTO}")
    tree = parse(text, AUTO)
    auto = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "AutoModelForCausalLM"), None)
    if auto is None:
        raise Unreadable(f"{AUTO} defines no AutoModelForCausalLM")
    first = any(isinstance(n, ast.Subscript) and isinstance(n.value, ast.Attribute) and n.value.attr == "architectures"
                and isinstance(n.slice, ast.Constant) and n.slice.value == 0 for n in ast.walk(auto))
    said = next((_template(n.exc.args[0]) for n in ast.walk(auto) if isinstance(n, ast.Raise)
                 and isinstance(n.exc, ast.Call) and isinstance(n.exc.func, ast.Name) and n.exc.func.id == "ValueError"
                 and n.exc.args and _template(n.exc.args[0], "AutoModelForCausalLM")), None)
    if not first or said is None:
        raise Unreadable(f"{AUTO}: AutoModelForCausalLM asks no architectures[0] or raises no ValueError naming it")
    out = {"listed": "first", "unsupported": f"ValueError: {said}"}
    renamed = _renamed(auto)
    return out | ({"renamed": renamed} if renamed else {})


def _template(node: ast.expr, holds: str = "") -> str | None:
    """An f-string whose one placeholder is the architecture: its text with `{architecture}` there."""
    if not isinstance(node, ast.JoinedStr):
        return None
    parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
    holes = [i for i, p in enumerate(parts) if p is None]
    if len(holes) != 1 or any(not isinstance(p, str) for i, p in enumerate(parts) if i not in holes):
        return None
    text = "".join("{architecture}" if p is None else p for p in parts)
    return text if holds in text else None


def _renamed(auto: ast.ClassDef) -> dict | None:
    """`if hasattr(<config>, "<key>"): <name> = "<prefix>" + <name>`: an EAGLE-3 draft's config asked under another
    name; a `<name>.replace("<cut>", "")` inside that branch cuts only there (`cut_when: key`), one outside it cuts every
    name asked (`cut_when: always`, the 1.0-era form)."""
    branch = next((n for n in ast.walk(auto) if isinstance(n, ast.If) and isinstance(n.test, ast.Call)
                   and isinstance(n.test.func, ast.Name) and n.test.func.id == "hasattr" and len(n.test.args) == 2
                   and isinstance(n.test.args[1], ast.Constant) and isinstance(n.test.args[1].value, str)
                   and any(_prefix(b) for b in ast.walk(n))), None)
    if branch is None:
        return None
    inside = [c for n in branch.body for c in _cuts(n)]
    outside = [c for c in _cuts(auto) if c not in inside]
    prefix = next(p for b in ast.walk(branch) if (p := _prefix(b)))
    cut, when = (inside[0], "key") if inside else (outside[0], "always") if outside else (None, None)
    return {"key": branch.test.args[1].value, "prefix": prefix} | ({"cut": cut, "cut_when": when} if cut else {})


def _prefix(node: ast.AST) -> str | None:
    """The string a `"<prefix>" + <name>` puts before the name."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.left, ast.Constant):
        return node.left.value if isinstance(node.left.value, str) and node.left.value else None
    return None


def _cuts(node: ast.AST) -> list[str]:
    """The texts every `<name>.replace("<text>", "")` under `node` cuts."""
    return [c.args[0].value for c in ast.walk(node) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr == "replace" and len(c.args) == 2 and all(isinstance(a, ast.Constant) for a in c.args)
            and c.args[1].value == "" and isinstance(c.args[0].value, str) and c.args[0].value]


def facts(source, tag: str | None) -> dict:
    """What one release's source says: its registry, its rule and where they were read."""
    read = registry(source)
    said = rule(source)
    where = {"repo": "NVIDIA/TensorRT-LLM"} | ({"tag": tag} if tag else {}) | source.where()
    where |= {"files": sorted(read.files + [AUTO]), "generator": "tools/trtllm_registry.py"}
    if read.unread:
        where["unread_registrations"] = dict(sorted(read.unread.items()))
    return {"registry": sorted(read.registry), "registry_rule": said, "source": where}


def write(file: Path, found: dict) -> None:
    """The data file with its registry, rule and their provenance replaced (every other key as it was)."""
    doc = json.loads(file.read_text(encoding="utf-8"))
    doc["rules"]["registry"] = found["registry"]
    doc["rules"]["registry_rule"] = found["registry_rule"]
    doc["source"]["registry"] = found["source"]
    file.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    ask = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ask.add_argument("--mirror", type=Path)
    ask.add_argument("--tree", type=Path)
    ask.add_argument("--file", choices=sorted(RELEASES))
    ask.add_argument("--write", action="store_true")
    ask.add_argument("--data", type=Path, default=DATA, help=argparse.SUPPRESS)
    args = ask.parse_args(argv)
    if (args.mirror is None) == (args.tree is None) or (args.tree is not None and args.file is None):
        ask.error("give --mirror GITDIR, or --tree DIR with --file")
    jobs = {args.file: None} if args.tree is not None else dict(RELEASES)
    missing = []
    for name, tag in jobs.items():
        try:
            source = TreeSource(args.tree) if args.tree is not None else GitSource.at(args.mirror, tag)
            found = facts(source, tag)
        except Unreadable as e:
            missing.append(name)
            print(json.dumps({"file": name, "unreadable": str(e)}))
            continue
        print(json.dumps({"file": name, "names": len(found["registry"]), "source": found["source"]}))
        if args.write:
            write(args.data / name, found)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
