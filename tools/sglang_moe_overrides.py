"""The `moe_backend_overrides` block of repair/targets/data/sglang-<release>.json, read from the release's wheel (ast).

    python -m tools.sglang_moe_overrides /tmp/sgl/sglang-0.5.23-*.whl [...]   (rewrites that block of each release's file)

Before a quant method picks its MoE runner backend by GPU (`create_moe_runner`'s `is_auto()` branch, read by
tools/sglang_expert_scales.py), a model's own server-arg override may set `moe_runner_backend` for its architecture
(srt/arg_groups/model_overrides/*.py: a provider registered with `_register_for("Arch", ...)` or
`register_model_override("Arch")`, returning `{"moe_runner_backend": "<backend>"}` or setting
`overrides["moe_runner_backend"] = "<backend>"`). Each such setting is recorded per architecture with the conditions
it is written under, quoted as SGLang writes them (the `if` tests enclosing it, an `else` branch's as `not (...)`, and
each earlier `if ...: return` guard of the function as `not (...)`), and the file:line. A setting in a module function
no provider is registered for or calls, a value that is not a constant, or a predicate-keyed provider
(`register_model_override_predicate`) that sets the backend stops the tool (read it anew). A release without the
folder records {} (0.5.9-0.5.11 have none). Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import zipfile
from pathlib import Path

from tools.sglang_expert_scales import write_from_wheels

FOLDER = "sglang/srt/arg_groups/model_overrides/"
KEY = "moe_runner_backend"
REGISTER = {"_register_for", "register_model_override"}


def _sets(node: ast.AST) -> str | None:
    """The backend `node` sets: `x["moe_runner_backend"] = "b"`, or a returned dict's "moe_runner_backend": "b"."""
    if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                            and t.slice.value == KEY for t in node.targets):
        value = node.value
    elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value == KEY for k in node.keys):
        value = node.values[[getattr(k, "value", None) for k in node.keys].index(KEY)]
    else:
        return None
    if not (isinstance(value, ast.Constant) and isinstance(value.value, str)):
        raise SystemExit(f"line {node.lineno}: {KEY} set to `{ast.unparse(value)}`, not a constant: read it anew")
    return value.value


def _conditions(node: ast.AST, fn: ast.FunctionDef, parents: dict) -> list[str]:
    """The tests `node` is written under inside `fn`: enclosing ifs (an else's negated) and earlier return guards."""
    out: list[str] = []
    while node is not fn:
        parent = parents[node]
        block = next((b for b in ("body", "orelse") if node in getattr(parent, b, ())), None)
        if isinstance(parent, ast.If) and block is not None:
            test = ast.unparse(parent.test)
            out.append(test if block == "body" else f"not ({test})")
        if block is not None:
            for earlier in getattr(parent, block)[:getattr(parent, block).index(node)]:
                if isinstance(earlier, ast.If) and not earlier.orelse and isinstance(earlier.body[-1], ast.Return):
                    out.append(f"not ({ast.unparse(earlier.test)})")
        node = parent
    return out[::-1]


def _architectures(fn: ast.FunctionDef, path: str) -> list[str]:
    names = []
    for d in fn.decorator_list:
        if isinstance(d, ast.Call) and getattr(d.func, "id", None) == "register_model_override_predicate":
            raise SystemExit(f"{path}:{fn.lineno}: a predicate-keyed provider sets {KEY}: read it anew")
        if isinstance(d, ast.Call) and getattr(d.func, "id", None) in REGISTER:
            if not all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in d.args):
                raise SystemExit(f"{path}:{fn.lineno}: {ast.unparse(d)} names no constant architecture: read it anew")
            names += [a.value for a in d.args]
    return names


def read_module(path: str, tree: ast.Module) -> dict[str, list[dict]]:
    """{architecture: [{"backend", "when", "where"}]} of one override module."""
    fns = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    out: dict[str, list[dict]] = {}
    for fn in fns.values():
        parents = {c: n for n in ast.walk(fn) for c in ast.iter_child_nodes(n)}
        settings = [(n, b) for n in ast.walk(fn) if (b := _sets(n)) is not None]
        if not settings:
            continue
        archs = _architectures(fn, path)
        if not archs:  # a helper: the registered providers calling it
            callers = [c for c in fns.values() if _architectures(c, path) and any(
                isinstance(n, ast.Call) and getattr(n.func, "id", None) == fn.name for n in ast.walk(c))]
            if not callers:
                raise SystemExit(f"{path}:{fn.lineno}: {fn.name} sets {KEY} and no registered provider calls it")
            archs = [a for c in callers for a in _architectures(c, path)]
        for node, backend in settings:
            stmt = node if isinstance(node, ast.stmt) else next(p for p in _ancestors(node, parents) if isinstance(p, ast.stmt))
            when = " and ".join(f"`{c}`" for c in _conditions(stmt, fn, parents)) or "always"
            for arch in archs:
                out.setdefault(arch, []).append({"backend": backend, "when": when, "where": f"{path}:{node.lineno}"})
    return out


def _ancestors(node: ast.AST, parents: dict):
    while node in parents:
        node = parents[node]
        yield node


def read_wheel(path: Path) -> tuple[str, str, dict]:
    """(release, the wheel's sha256, {architecture: [setting]}) of one SGLang wheel."""
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    out: dict[str, list[dict]] = {}
    with zipfile.ZipFile(path) as wheel:
        for name in sorted(n for n in wheel.namelist() if n.startswith(FOLDER) and n.endswith(".py")):
            for arch, settings in read_module(name, ast.parse(wheel.read(name).decode())).items():
                out.setdefault(arch, []).extend(settings)
    return release, hashlib.sha256(path.read_bytes()).hexdigest(), dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    return write_from_wheels(argv, "moe_backend_overrides", read_wheel)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
