"""The shape of repair/, read from the source with `ast` (nothing is imported): imports point down the flow of
docs/ARCHITECTURE.md without cycles, the only imports inside functions are the documented lazy ones, no module is
over 300 lines, and no block of 6+ lines is written twice. Each failure lists its violations as file:line."""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "repair"
MAX_LINES = 300
DUPLICATE_LINES = 6

# The flow, bottom first: a module may import its own layer and the layers before it, never one after it.
# A layer is the first name below `repair` (repair.io.checkpoint is in "io"); docs/ARCHITECTURE.md draws the flow.
LAYERS = (
    ("errors", "recipes", "version"),  # the error family, the built-in recipe files, the version: below everything
    ("io",),
    ("codec",),
    ("formats",),
    ("arch",),
    ("targets",),
    ("doctor",),
    ("planning",),
    ("execute",),
    ("tp",),
    ("api",),  # the facade over plan and execute: the Hub workflow and the CLI run through it
    ("hub",),
    ("demo",),
    ("web",),  # the web front door (the Space's app): wires widgets to the library; only `ckpt-repair serve` imports it
    ("cli", "__main__"),
    ("",),  # repair/__init__.py: `repair.plan` / `repair.run`, above everything
)
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# Imports allowed inside a function, each with why. Everything else is imported at the top of its module;
# an import inside a function that only dodges an import cycle hides the cycle from readers and from this test.
LAZY_IMPORTS = {
    "torch": "import costs ~1 s and 200 MB; inspect, doctor and the table-path fix never pay it",
    "huggingface_hub": "the Hub client is slow to import and only hub sources and `hub` commands need it",
    "repair.hub.client": "our wrapper of huggingface_hub: lazy for the same reason",
    "tqdm": "~12 ms to import (it reads its package metadata); only a bar that is shown needs it (repair/io/progress.py)",
    "<modules importing torch at the top>": "importing them imports torch (computed from the code: torch_modules())",
    "<anything in repair/cli/>": "command modules import their stage on use, so `ckpt-repair --help` starts fast",
    "<anything in repair/__init__.py>": "`import repair` stays cheap; repair.plan/run import the API on first call",
}


@dataclass(frozen=True)
class Import:
    """One import statement's target module (a repair module, or a third-party top-level name)."""

    source: str  # importing module, e.g. "repair.doctor.checks"
    target: str  # imported module, e.g. "repair.doctor" or "torch"
    path: Path
    line: int
    in_function: bool
    type_only: bool  # under `if TYPE_CHECKING:`; never executed, so it cannot make a cycle

    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(node: ast.ImportFrom, source: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = source.split(".") if is_package else source.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _targets(node: ast.Import | ast.ImportFrom, source: str, is_package: bool) -> list[str]:
    """What one statement imports; `from repair.x import y` imports repair.x.y when y is a submodule."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _resolve(node, source, is_package)
    known = modules()
    return sorted({f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names})


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


DYNAMIC = "<a module named at run time>"


def _imported_by_call(node: ast.AST) -> str | None:
    """The module `importlib.import_module(...)` or `__import__(...)` imports (DYNAMIC when not a literal), else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    if not ((isinstance(func, ast.Name) and func.id in ("__import__", "import_module"))
            or (isinstance(func, ast.Attribute) and func.attr == "import_module")):
        return None
    arg = node.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else DYNAMIC


def _walk(node: ast.AST, in_function: bool, type_only: bool):
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function, type_only
            continue
        called = _imported_by_call(child)
        if called:  # an import by call is an import: it may not dodge the rules above
            yield ast.Import(names=[ast.alias(name=called)], lineno=child.lineno), in_function, type_only
        func = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        guarded = type_only or (isinstance(child, ast.If) and _is_type_checking(child))
        yield from _walk(child, func, guarded)


@cache
def imports() -> tuple[Import, ...]:
    found = []
    for source, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        for node, in_function, type_only in _walk(tree, False, False):
            for target in _targets(node, source, path.name == "__init__.py"):
                found.append(Import(source, target, path, node.lineno, in_function, type_only))
    return tuple(found)


def _inside(target: str, name: str) -> bool:
    return target == name or target.startswith(name + ".")


@cache
def torch_modules() -> frozenset[str]:
    """repair modules whose top-level imports include torch."""
    return frozenset(i.source for i in imports() if _inside(i.target, "torch") and not i.in_function and not i.type_only)


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one module (or one that imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _top_level_edges() -> list[Import]:
    """Imports between repair modules that run when the importing module loads."""
    return [i for i in imports() if i.target in modules() and not i.in_function and not i.type_only]


def _graph(edges: list[Import]) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {name: set() for name in modules()}
    for edge in edges:
        graph[edge.source].add(edge.target)
    return graph


def _reaches(graph: dict[str, set[str]], start: str, goal: str) -> bool:
    seen, todo = set(), [start]
    while todo:
        node = todo.pop()
        if node == goal:
            return True
        if node not in seen:
            seen.add(node)
            todo.extend(graph[node])
    return False


def cycle_violations() -> list[str]:
    """Every import cycle among repair modules, counting module-level imports (executed when the module loads)."""
    edges = _top_level_edges()
    graph = _graph(edges)
    out = []
    for component in _strongly_connected(graph):
        members = set(component)
        inside = [f"{e.where()} {e.source} -> {e.target}" for e in edges if e.source in members and e.target in members]
        out.append(f"cycle {' <-> '.join(component)}: " + "; ".join(inside))
    return out


def _lazy_allowed(edge: Import) -> bool:
    return (
        _inside(edge.target, "torch")
        or _inside(edge.target, "huggingface_hub")
        or _inside(edge.target, "tqdm")
        or edge.target == "repair.hub.client"
        or edge.target in torch_modules()
        or _inside(edge.source, "repair.cli")
        or edge.source == "repair"
    )


def lazy_violations() -> list[str]:
    """Imports inside functions outside LAZY_IMPORTS; those that would close a cycle if moved to the top say so."""
    graph = _graph(_top_level_edges())
    out = []
    for edge in imports():
        if edge.in_function and not _lazy_allowed(edge):
            dodge = edge.target in graph and _reaches(graph, edge.target, edge.source)
            out.append(f"{edge.where()} {edge.source} imports {edge.target} inside a function" + (" (hides a cycle)" if dodge else ""))
    return out


def size_violations() -> list[str]:
    out = []
    for path in modules().values():
        count = len(path.read_text().splitlines())
        if count > MAX_LINES:
            out.append(f"{path.relative_to(REPO)}:{count} has {count} lines (at most {MAX_LINES})")
    return out


def layer_violations() -> list[str]:
    """Every import, at the top or inside a function, that points up the flow."""
    out = []
    for edge in imports():
        if edge.target not in modules():
            continue
        below, above = layer(edge.source), layer(edge.target)
        if RANK[above] > RANK[below]:
            out.append(f"{edge.where()} {edge.source} ({below or 'repair'}) imports {edge.target} ({above or 'repair'}), a later stage")
    return out


_IGNORED = re.compile(r"^(#.*|[()\[\]{},:;]+|(from\s+\S+\s+)?import\s.*)$")


def _docstring_lines(tree: ast.Module) -> set[int]:
    """Lines of string statements (docstrings): prose, not code."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def _code_lines(path: Path) -> list[tuple[int, str]]:
    """Lines that count for duplication, white space folded: not blank, comments, lone punctuation, imports or docstrings."""
    text = path.read_text()
    prose = _docstring_lines(ast.parse(text))
    kept = []
    for number, line in enumerate(text.splitlines(), 1):
        folded = " ".join(line.split())
        if folded and number not in prose and not _IGNORED.match(folded):
            kept.append((number, folded))
    return kept


def duplicate_violations() -> list[str]:
    """Every run of 6+ kept lines that stands, letter for letter, in two places of repair/.

    `duplicates` (the tool library's command) also pairs runs alike but for names and values; this finds exact ones.
    """
    code = {path: _code_lines(path) for path in modules().values()}
    places: dict[tuple[str, ...], list[tuple[Path, int]]] = defaultdict(list)
    for path, lines in code.items():
        for i in range(len(lines) - DUPLICATE_LINES + 1):
            places[tuple(text for _, text in lines[i : i + DUPLICATE_LINES])].append((path, i))
    pairs: set[tuple[Path, int, Path, int]] = set()  # (file a, window in a, file b, window in b): one window pair each
    for spots in places.values():
        for n, (a, i) in enumerate(spots):
            for b, j in spots[n + 1 :]:
                if not (a == b and abs(i - j) < DUPLICATE_LINES):  # a run of repeated lines overlapping itself
                    pairs.add((a, i, b, j))
    out = []
    for a, i, b, j in sorted(pairs, key=lambda p: (str(p[0]), p[1], str(p[2]), p[3])):
        if (a, i - 1, b, j - 1) in pairs:
            continue  # inside a longer run, reported from its first window
        k = i
        while (a, k + 1, b, j + k + 1 - i) in pairs:
            k += 1
        last = DUPLICATE_LINES - 1 + k - i
        out.append(f"{_span(code, a, i, last)} ~ {_span(code, b, j, last)}")
    return out


def _span(code: dict[Path, list[tuple[int, str]]], path: Path, first: int, last: int) -> str:
    return f"{path.relative_to(REPO)}:{code[path][first][0]}-{code[path][first + last][0]}"


def _assert_none(title: str, violations: list[str]) -> None:
    assert not violations, f"{title} ({len(violations)}):\n  " + "\n  ".join(violations)


def test_layers_cover_every_package():
    assert {layer(name) for name in modules()} <= set(RANK), "a new package in repair/ needs its place in LAYERS"


def test_no_import_cycles():
    _assert_none("import cycles in repair/", cycle_violations())


def test_imports_inside_functions_are_the_documented_lazy_ones():
    _assert_none("imports inside functions outside LAZY_IMPORTS", lazy_violations())


def test_no_module_over_300_lines():
    _assert_none("modules over 300 lines", size_violations())


def test_imports_point_down_the_flow():
    _assert_none("imports pointing up the flow (see LAYERS)", layer_violations())


def test_no_block_of_six_lines_twice():
    _assert_none("blocks of 6+ lines written twice in repair/", duplicate_violations())


def test_the_walker_sees_what_it_checks():
    """The checks above pass only on a clean tree; this shows their parts catch each defect on a planted one."""
    assert _strongly_connected({"a": {"b"}, "b": {"a"}, "c": {"c"}, "d": {"a"}}) == [["a", "b"], ["c"]]
    planted = ast.parse("import x\nif TYPE_CHECKING:\n    import y\nclass K:\n    def f(self):\n        import z\n")
    seen = {node.names[0].name: (in_function, type_only) for node, in_function, type_only in _walk(planted, False, False)}
    assert seen == {"x": (False, False), "y": (False, True), "z": (True, False)}
    by_call = ast.parse("import importlib\ndef f(name):\n    importlib.import_module('repair.io.names')\n    __import__('repair.codec')\n"
                        "    return importlib.import_module(name)\n")
    seen = {node.names[0].name: in_function for node, in_function, _ in _walk(by_call, False, False)}
    assert seen == {"importlib": False, "repair.io.names": True, "repair.codec": True, DYNAMIC: True}
    doc = "| 1 | `io/` | headers (`safetensors.py`) |\nSRC --> Plan   execute/writer.py, compute.py\nsee `tp/manifest.py`\n`vllm_loader.py` alone"
    assert doc_paths(doc) == {"repair/io/safetensors.py", "repair/execute/writer.py", "repair/execute/compute.py", "repair/tp/manifest.py"}


def doc_paths(doc: str) -> set[str]:
    """Every file a doc names, as a path from the repository: `repair/...`, `tests/...`, `tools/...`, `recipes/...`;
    a path inside repair/ (`io/atomic.py`); and a bare `name.py` after one on the same line (`execute/writer.py,
    compute.py`, or a layers-table row's `io/` ... `atomic.py`). Folder mentions (ending in /) are not files."""
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    found = set()
    for line in doc.splitlines():
        context = None  # the package a bare `name.py` is in, once the line has named one
        for word in re.findall(r"[^\s`|,;:()\"']+", line):
            path = word.rstrip(".")
            first = path.split("/")[0]
            if "<" in path:
                continue
            if "/" in path and first in packages:
                path, context = f"repair/{path}", f"repair/{first}"
            elif "/" not in path or first not in ("repair", "tests", "tools", "recipes"):
                path = f"{context}/{path}" if context and re.fullmatch(r"\w+\.py", path) else ""
            if path and not path.endswith("/"):
                found.add(path)
    return found
