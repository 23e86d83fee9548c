"""The `experts_gate_up_scale_2` block of repair/targets/data/sglang-<release>.json, read from the release's wheel (ast).

    pip download --no-deps sglang==0.5.23 -d /tmp/sgl
    python -m tools.sglang_expert_scales /tmp/sgl/sglang-0.5.23-*.whl [...]   (rewrites that block of each release's file)

SGLang loads each routed expert's gate (w1) and up (w3) global scale into column 0 and 1 of one [E, 2] parameter (as
vLLM does, tools/vllm_expert_scales.py) and its NVFP4 MoE method decides, in `process_weights_after_loading`, what the
kernel gets. Two shapes of that method are read, each anchored by ast; anything else stops the tool (read it anew):
- one column kept for every backend (`X = layer.<param>[:, N]` outside any backend test) and one warning logged:
  ModelOpt's method in 0.5.9-0.5.11, compressed-tensors' W4A4 scheme in every release. Recorded as vLLM's form,
  {"keeps", "log", "where"}.
- 0.5.23's ModelOpt method: the column kept under a backend test (`moe_runner_backend.is_marlin()`), the other backends
  given `_compute_gemm1_alphas(layer.<param>, ...)`, whose two results are the gate's (column 0) and the up's (column
  1) alphas. Which backend reads the up's is asked of `apply`: each backend branch's `layer.<attr>` reads, an
  attribute carrying the up's alpha where it is `g1_alphas_up` or is set from an expression reading one that does
  (flashinfer_trtllm.py's `g1_scale_c`), across the method's module and the MoE runners'. Recorded as
  {"backends": {name: {"keeps", "log"?}}, "default": [{"backend", "when"}], "option", "where"}, the default read from
  the server args' own pick for the quant method when none is asked for (arg_groups/overrides.py: flashinfer_cutlass
  for modelopt_fp4 on SM110/SM120), then `create_moe_runner`'s `is_auto()` branch. Model-specific server-arg
  overrides (srt/arg_groups/model_overrides/), applied before both, are tools/sglang_moe_overrides.py's block.
- modelopt_mixed: recorded as modelopt_fp4 where ModelOptMixedPrecisionConfig.get_quant_method builds the same class.
- compressed-tensors NVFP4 MoE where the config picks a scheme by GPU (`_check_scheme_supported(X.get_min_capability(),
  error=False)` then a fallback `return Y(...)`): each scheme read as above or, for one that raises when an expert's
  columns differ (`(p != p[:, :1]).any(...)` then `raise ValueError`), {"refuses": its message, "test": "exact"}.
  Recorded for W4A4 (`precisions`: nvfp4); a weight-only (nvfp4a16) config's scheme (`_is_fp4a16_nvfp4`, 0.5.23:
  one scheme on every GPU, which refuses) as `by_precision` {"w4a16_nvfp4": its fact}, where the release has one.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "repair" / "targets" / "data"
QUANT = "sglang/srt/layers/quantization/"
MODELOPT = (QUANT + "modelopt_quant.py", "ModelOptNvFp4FusedMoEMethod", "w13_weight_scale_2")
CT = QUANT + "compressed_tensors/compressed_tensors.py"
CT_SCHEMES = QUANT + "compressed_tensors/schemes/"
RUNNERS = "sglang/srt/layers/moe/moe_runner/"
OVERRIDES = ("sglang/srt/arg_groups/overrides.py", "_moe_runner_backend_quant_constraints")
KEPT = {0: "gate", 1: "up"}
UP_SEED = "g1_alphas_up"  # _compute_gemm1_alphas' second result, as process_weights_after_loading names it
CONDITIONS = {  # create_moe_runner's auto test, in words (an unknown test is quoted as written)
    "is_cuda() and (8, 0) <= get_device_capability() < (10, 0)": "on a CUDA GPU of compute capability 8.0 to 9.x "
                                                                   "(Ampere, Ada, Hopper)"}


def _class_method(tree: ast.Module, cls: str, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            return next((i for i in node.body if isinstance(i, ast.FunctionDef) and i.name == name), None)
    return None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _column(node: ast.AST, param: str) -> int | None:
    """`<...>.<param>[:, N]` or `<param>[:, N]`: N; anything else None."""
    base = node.value if isinstance(node, ast.Subscript) else None
    if (getattr(base, "attr", None) == param or getattr(base, "id", None) == param) \
            and isinstance(node.slice, ast.Tuple) and isinstance(node.slice.elts[0], ast.Slice):
        last = node.slice.elts[-1]
        return last.value if isinstance(last, ast.Constant) and isinstance(last.value, int) else None
    return None


def _backend_tests(node: ast.AST, parents: dict) -> list[str]:
    """The backends (`<x>.is_<name>()`) of the `if` tests whose body holds `node`."""
    out = []
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If) and node in parent.body:
            out += [c.func.attr[3:] for c in ast.walk(parent.test) if isinstance(c, ast.Call)
                    and isinstance(c.func, ast.Attribute) and c.func.attr.startswith("is_") and not c.args
                    and c.func.attr not in ("is_gated",)]
        node = parent
    return out


def _in_test(node: ast.AST, parents: dict) -> bool:
    """Whether `node` is part of an `if` test or a comparison call (torch.allclose), not a value used."""
    while node in parents:
        parent = parents[node]
        if isinstance(parent, ast.If) and node is parent.test:
            return True
        if isinstance(parent, ast.Call) and getattr(parent.func, "attr", None) == "allclose":
            return True
        node = parent
    return False


def _warning(fn: ast.AST, prefix: str) -> str | None:
    logs = {c.args[0].value for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
            and c.func.attr.startswith("warning") and c.args and isinstance(c.args[0], ast.Constant)
            and isinstance(c.args[0].value, str) and c.args[0].value.startswith(prefix)}
    if len(logs) > 1:
        raise SystemExit(f"more than one {prefix!r} warning: {sorted(logs)}")
    return logs.pop() if logs else None


def _refusal(fn: ast.FunctionDef, param: str) -> str | None:
    """The ValueError raised under a test of a name set from `x != x[:, :1]` (an expert's columns differ exactly), its
    constant text joined."""
    differs = {t.id for n in ast.walk(fn) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
               and any(isinstance(c, ast.Compare) and isinstance(c.ops[0], ast.NotEq) for c in ast.walk(n.value))}
    for node in ast.walk(fn):
        if isinstance(node, ast.If) and _mentions(node.test, differs):
            for exc in (n.exc for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Raise)):
                if isinstance(exc, ast.Call) and getattr(exc.func, "id", None) == "ValueError" and exc.args:
                    return "ValueError: " + " ".join(_text(exc.args[0]).split())
    return None


def _text(node: ast.expr) -> str:
    """A message's text as written: adjacent literals joined, each f-string placeholder shown as `...`."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
        return "".join("..." if p is None else p for i, p in enumerate(parts) if p is not None or i == 0
                       or parts[i - 1] is not None)  # adjacent placeholders shown once
    return "..."


def one_column(fn: ast.FunctionDef, param: str, where: str, log_prefix: str) -> dict:
    """The first shape: one column of `param` kept for every backend, one warning (or a refusal)."""
    parents = _parents(fn)
    kept = {(_column(n, param), tuple(_backend_tests(n, parents))) for n in ast.walk(fn)
            if _column(n, param) is not None and not _in_test(n, parents)}
    if not kept and (refused := _refusal(fn, param)):
        return {"refuses": refused, "test": "exact", "where": where}
    if len(kept) != 1 or next(iter(kept))[1]:
        raise SystemExit(f"{where}: expected one column of {param} kept for every backend, found {sorted(kept)}")
    log = _warning(fn, log_prefix)
    if log is None:
        raise SystemExit(f"{where}: no {log_prefix!r} warning")
    return {"keeps": KEPT[next(iter(kept))[0]], "log": log, "where": where}


def _mentions(node: ast.AST, names: set[str]) -> bool:
    return any((isinstance(n, ast.Attribute) and n.attr in names) or (isinstance(n, ast.Name) and n.id in names)
               or (isinstance(n, ast.Constant) and n.value in names) for n in ast.walk(node))


def up_attributes(trees: list[ast.Module]) -> set[str]:
    """Layer attributes that carry the up half's alpha: UP_SEED, and any set (`layer.X = ...`,
    `copy_or_rebind_param(layer, "X", ...)`) from an expression whose function's locals read one (fixpoint)."""
    attrs = {UP_SEED}
    while True:
        before = set(attrs)
        for tree in trees:
            for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
                local: set[str] = set()
                for _ in range(3):  # locals assigned from locals, in a few steps
                    for n in ast.walk(fn):
                        if isinstance(n, ast.Assign) and _mentions(n.value, attrs | local):
                            local |= {t.id for t in n.targets if isinstance(t, ast.Name)}
                for n in ast.walk(fn):
                    if isinstance(n, ast.Assign) and _mentions(n.value, attrs | local):
                        attrs |= {t.attr for t in n.targets if isinstance(t, ast.Attribute)}
                    if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "copy_or_rebind_param" \
                            and len(n.args) == 3 and isinstance(n.args[1], ast.Constant) \
                            and _mentions(n.args[2], attrs | local) and n.args[1].value != "g1_alphas":
                        attrs.add(n.args[1].value)  # g1_alphas is the gate's (it becomes the max only where both are)
        if attrs == before:
            return attrs


def split_backends(tree: ast.Module, runner_trees: list[ast.Module], where: str) -> dict:
    """The second shape (0.5.23): {backend: {"keeps", "log"?}} and the default."""
    cls, param = MODELOPT[1], MODELOPT[2]
    fn = _class_method(tree, cls, "process_weights_after_loading")
    parents = _parents(fn)
    guarded = {(_column(n, param), tuple(_backend_tests(n, parents))) for n in ast.walk(fn)
               if _column(n, param) is not None and not _in_test(n, parents)}
    if len(guarded) != 1 or len(next(iter(guarded))[1]) != 1:
        raise SystemExit(f"{where}: expected one column of {param} kept under one backend test, found {sorted(guarded)}")
    column, (collapsed,) = next(iter(guarded))
    helper = _gemm1_helper(tree, fn, param, where)
    backends = {collapsed: {"keeps": KEPT[column], "log": _warning(fn, "w1_")}}
    up = up_attributes([tree, *runner_trees])
    apply_fn = _class_method(tree, cls, "apply")
    for node in (n for n in ast.walk(apply_fn) if isinstance(n, ast.If)):
        names = [c.func.attr[3:] for c in ast.walk(node.test) if isinstance(c, ast.Call)
                 and isinstance(c.func, ast.Attribute) and c.func.attr.startswith("is_flashinfer_")]
        if not names:
            continue
        read = {n.attr for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Name) and n.value.id == "layer"}
        read |= {n.args[1].value for stmt in node.body for n in ast.walk(stmt) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "getattr" and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)}
        for name in names:
            if name == "flashinfer_megamoe":
                continue  # an a2a backend whose layer prep checks the two alphas itself: not read here
            backends.setdefault(name, {"keeps": "both" if read & up else "gate" if "g1_alphas" in read
                                       else None})
    if any(v["keeps"] is None for v in backends.values()):
        raise SystemExit(f"{where}: a backend branch of apply reads no GEMM1 alpha: {backends}")
    return {"backends": backends, "default": _default(tree, cls, where), "option": "--moe-runner-backend",
            "default_note": "a model's own server-arg override of it, where one applies, is named first",
            "where": f"{where} (with {helper})"}


def _gemm1_helper(tree: ast.Module, fn: ast.FunctionDef, param: str, where: str) -> str:
    """The module function given the whole [E, 2] parameter, checked to split it into column 0 then column 1."""
    calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.args
             and isinstance(c.args[0], ast.Attribute) and c.args[0].attr == param]
    if len(calls) != 1:
        raise SystemExit(f"{where}: expected one helper given layer.{param} whole, found {len(calls)}")
    name = calls[0].func.id
    helper = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    columns = [_column(n, param) for n in ast.walk(helper)] if helper else []
    returned = next((n.value for n in ast.walk(helper) if isinstance(n, ast.Return)), None) if helper else None
    if sorted(c for c in columns if c is not None) != [0, 1] or not isinstance(returned, ast.Tuple) \
            or len(returned.elts) != 2:
        raise SystemExit(f"{where}: {name} no longer splits {param} into its gate and up columns")
    return f"{name}: (gate's alpha, up's alpha)"


def _default(tree: ast.Module, cls: str, where: str) -> list[dict]:
    """create_moe_runner's `is_auto()` branch: [{"backend", "when"}]."""
    fn = _class_method(tree, cls, "create_moe_runner")
    auto = next((n for n in ast.walk(fn) if isinstance(n, ast.If) and "is_auto" in ast.unparse(n.test)), None) if fn else None
    if auto is None:
        return []  # no automatic choice in this release

    def picked(body) -> str | None:
        for stmt in body:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Attribute):
                return stmt.value.attr.lower()
        return None
    first = auto.body[0]
    if isinstance(first, ast.If) and picked(first.body) and picked(first.orelse):
        test = ast.unparse(first.test)
        return [{"backend": picked(first.body), "when": CONDITIONS.get(test, f"where `{test}`")},
                {"backend": picked(first.orelse), "when": "otherwise"}]
    if picked(auto.body):
        return [{"backend": picked(auto.body), "when": "always"}]
    raise SystemExit(f"{where}: create_moe_runner's automatic choice is neither one backend nor an if/else of two")


def server_arg_defaults(wheel: zipfile.ZipFile, method: str, backends: dict) -> list[dict]:
    """The server args' own pick for `method` where the user asked for none, ahead of the method's (OVERRIDES: `if
    moe_runner_backend == "auto" and view.quantization == "<method>" and <get_platform().is_smNNN, or'ed>:
    moe_runner_backend = "<backend>"`): [{"backend", "when"}]; any other test there stops the tool."""
    if OVERRIDES[0] not in wheel.namelist():
        raise SystemExit(f"{OVERRIDES[0]} is not in the wheel: read the server args' MoE backend choice anew")
    tree = ast.parse(wheel.read(OVERRIDES[0]).decode())
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == OVERRIDES[1]), None)
    if fn is None:
        raise SystemExit(f"{OVERRIDES[0]}: no {OVERRIDES[1]}: read the server args' MoE backend choice anew")
    out = []
    for node in (n for n in ast.walk(fn) if isinstance(n, ast.If) and f"view.quantization == '{method}'" in ast.unparse(n.test)):
        parts = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) else [node.test]
        said = [ast.unparse(p) for p in parts]
        gpus = [p for p in parts if ast.unparse(p) not in ("moe_runner_backend == 'auto'", f"view.quantization == '{method}'")]
        levels = [re.fullmatch(r"get_platform\(\)\.is_sm(\d+)(\d)", ast.unparse(a)) for g in gpus
                  for a in (g.values if isinstance(g, ast.BoolOp) and isinstance(g.op, ast.Or) else [g])]
        picked = [b.value.value for b in node.body if isinstance(b, ast.Assign) and ast.unparse(b.targets[0]) ==
                  "moe_runner_backend" and isinstance(b.value, ast.Constant)]
        if "moe_runner_backend == 'auto'" not in said or len(gpus) != 1 or not all(levels) or len(picked) != 1 \
                or picked[0] not in backends:
            raise SystemExit(f"{OVERRIDES[0]}: {OVERRIDES[1]} picks for {method} under `{ast.unparse(node.test)}`: read it anew")
        gpu = " or ".join(f"{m.group(1)}.x" for m in sorted(levels, key=lambda m: int(m.group(1))))
        out.append({"backend": picked[0], "when": f"on a GPU of compute capability {gpu} when --quantization {method} "
                                                  "is given"})
    return out


def compressed_tensors(wheel: zipfile.ZipFile, release: str) -> dict:
    """compressed-tensors' NVFP4 MoE: the W4A4 scheme, and where the config falls back to another by GPU, both."""
    ct = ast.parse(wheel.read(CT).decode())
    branch = next((n for n in ast.walk(ct) if isinstance(n, ast.If) and "_is_fp4a4_nvfp4" in ast.unparse(n.test)
                   and any("Nvfp4MoE" in ast.unparse(s) for s in n.body)), None)
    if branch is None:
        raise SystemExit(f"sglang {release}: {CT} picks no NVFP4 MoE scheme for an fp4a4 config")
    returns = sorted((n for n in ast.walk(ast.Module(branch.body, [])) if isinstance(n, ast.Return)),
                     key=lambda n: n.lineno)
    schemes = [re.match(r"(\w+)\(", ast.unparse(r.value)).group(1) for r in returns]
    facts = {s: _scheme(wheel, s, release) for s in dict.fromkeys(schemes)}
    weight_only = _weight_only(wheel, ct, release)
    extra = {"by_precision": {"w4a16_nvfp4": weight_only}} if weight_only else {}
    if len(facts) == 1:
        return next(iter(facts.values())) | {"precisions": ["nvfp4"]} | extra
    gate = next((n for n in branch.body if isinstance(n, ast.If) and "get_min_capability" in ast.unparse(n.test)), None)
    asked = re.search(r"(\w+)\.get_min_capability", ast.unparse(gate.test)).group(1) if gate else None
    if len(facts) != 2 or asked != schemes[0]:
        raise SystemExit(f"sglang {release}: {CT}'s fp4a4 MoE branch returns {schemes}: read it anew")
    need = _min_capability(wheel, asked, release)
    return {"backends": facts, "option": None, "where": f"{CT} fp4a4 MoE branch", "precisions": ["nvfp4"],
            "default": [{"backend": asked, "when": f"on a GPU of compute capability {need // 10}.{need % 10} or above"},
                        {"backend": schemes[-1], "when": "otherwise"}]} | extra


def _weight_only(wheel: zipfile.ZipFile, ct: ast.Module, release: str) -> dict | None:
    """A weight-only (nvfp4a16) config's NVFP4 MoE scheme, where the release has one (`_is_fp4a16_nvfp4` returning one
    scheme on every GPU): {"precisions": ["w4a16_nvfp4"]} with its reading, a refusal as its one default."""
    branch = next((n for n in ast.walk(ct) if isinstance(n, ast.If) and "_is_fp4a16_nvfp4" in ast.unparse(n.test)
                   and any("Nvfp4MoE" in ast.unparse(s) for s in n.body)), None)
    if branch is None:
        return None  # no weight-only NVFP4 MoE scheme in this release
    body = ast.Module(branch.body, [])
    schemes = {re.match(r"(\w+)\(", ast.unparse(r.value)).group(1) for r in ast.walk(body) if isinstance(r, ast.Return)}
    if len(schemes) != 1 or any(isinstance(n, ast.If) for n in ast.walk(body)):
        raise SystemExit(f"sglang {release}: {CT}'s fp4a16 MoE branch is not one scheme on every GPU: read it anew")
    (scheme,) = schemes
    fact = _scheme(wheel, scheme, release)
    if "refuses" in fact:
        fact = {"backends": {scheme: fact}, "option": None, "where": f"{CT} fp4a16 MoE branch",
                "default": [{"backend": scheme, "when": "on every GPU"}]}
    return fact | {"precisions": ["w4a16_nvfp4"]}


def _scheme_tree(wheel: zipfile.ZipFile, scheme: str) -> tuple[str, ast.Module]:
    for name in wheel.namelist():
        if name.startswith(CT_SCHEMES) and name.endswith(".py"):
            tree = ast.parse(wheel.read(name).decode())
            if any(isinstance(n, ast.ClassDef) and n.name == scheme for n in tree.body):
                return name, tree
    raise SystemExit(f"no {scheme} under {CT_SCHEMES}")


def _scheme(wheel: zipfile.ZipFile, scheme: str, release: str) -> dict:
    path, tree = _scheme_tree(wheel, scheme)
    fn = _class_method(tree, scheme, "process_weights_after_loading")
    if fn is None:
        raise SystemExit(f"sglang {release}: {scheme} has no process_weights_after_loading")
    return one_column(fn, "w13_weight_global_scale", f"{path[:-3].replace('/', '.')}.{scheme}", "w1_")


def _min_capability(wheel: zipfile.ZipFile, scheme: str, release: str) -> int:
    _, tree = _scheme_tree(wheel, scheme)
    fn = _class_method(tree, scheme, "get_min_capability")
    value = next((n.value.value for n in ast.walk(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant)),
                 None) if fn else None
    if not isinstance(value, int):
        raise SystemExit(f"sglang {release}: {scheme}.get_min_capability returns no constant")
    return value


def read_wheel(path: Path) -> tuple[str, str, dict]:
    """(release, the wheel's sha256, {quant method: fact}) of one SGLang wheel."""
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    with zipfile.ZipFile(path) as wheel:
        tree = ast.parse(wheel.read(MODELOPT[0]).decode())
        where = f"{MODELOPT[0]} {MODELOPT[1]}.process_weights_after_loading"
        fn = _class_method(tree, MODELOPT[1], "process_weights_after_loading")
        if fn is None:
            raise SystemExit(f"sglang {release}: no {MODELOPT[1]}.process_weights_after_loading")
        if "_compute_gemm1_alphas" in ast.unparse(fn) or any(_backend_tests(n, _parents(fn)) for n in ast.walk(fn)
                                                            if _column(n, MODELOPT[2]) is not None):
            runners = [ast.parse(wheel.read(n).decode()) for n in wheel.namelist()
                       if n.startswith(RUNNERS) and n.endswith(".py") and "flashinfer" in n]
            fact = split_backends(tree, runners, where)
        else:
            fact = one_column(fn, MODELOPT[2], where, "w1_")
        methods = ["modelopt_fp4"]
        mixed = _class_method(tree, "ModelOptMixedPrecisionConfig", "get_quant_method")
        if mixed is not None and any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == MODELOPT[1]
                                     for n in ast.walk(mixed)):
            methods.append("modelopt_mixed")  # the mixed config builds NVFP4 experts with the same method
        facts = {m: fact | {"default": server_arg_defaults(wheel, m, fact["backends"]) + fact["default"]}
                 if "backends" in fact else fact for m in methods}
        for method, picked in ((m, [d["backend"] for d in f.get("default", ())]) for m, f in facts.items()):
            if len(set(picked)) != len(picked):  # doctor reads one condition per backend
                raise SystemExit(f"sglang {release}: {method}'s default names a backend under two conditions: {picked}")
        facts["compressed-tensors"] = compressed_tensors(wheel, release)
    return release, hashlib.sha256(path.read_bytes()).hexdigest(), facts


def write_from_wheels(argv: list[str], key: str, read) -> int:
    """Rewrite the `key` block of each wheel's release file with `read(wheel) -> (release, sha256, block)`, refusing a
    wheel other than the one the file was read from."""
    for arg in argv:
        release, digest, facts = read(Path(arg))
        out = DATA / f"sglang-{release}.json"
        doc = json.loads(out.read_text(encoding="utf-8"))
        if doc["source"]["sha256"] != digest:
            raise SystemExit(f"{arg} is not the wheel {out.name} was read from (sha256 {doc['source']['sha256']})")
        doc["rules"][key] = facts
        out.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"wrote {out.relative_to(ROOT)}: {json.dumps(facts)[:200]}")
    return 0


def main(argv: list[str]) -> int:
    return write_from_wheels(argv, "experts_gate_up_scale_2", read_wheel)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
