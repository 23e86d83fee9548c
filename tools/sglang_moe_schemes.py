"""The `moe_scheme_refused` block of repair/targets/data/sglang-<release>.json, read from the release's wheel.

    pip download --no-deps sglang==0.5.9 -d /tmp/sgl
    python -m tools.sglang_moe_schemes /tmp/sgl/sglang-0.5.9-*.whl [...]   (rewrites that block of each release's file)

A wheel of a release no file ships (0.5.13-0.5.22, which fall back to the newest file at or below) is read too: each
fact of that file its release does not refuse gets the release in its `built_by` (doctor tells that release nothing);
give those wheels in the same run as the file's own (rewriting the file's block drops its `built_by`).

SGLang builds a compressed-tensors MoE layer with the scheme `CompressedTensorsConfig.get_moe_scheme` picks from the
layer's config group (compressed_tensors.py): one `if self._is_X(weight_quant, input_quant): ... elif ...: ... else:
raise RuntimeError(...)` chain. A config the chain has no scheme for stops the model while it is built, before any
weight loads. For each declared algorithm in ALGORITHMS, this tool takes the producer's own quantization args
(compressed-tensors' preset, as llm-compressor writes them), and asks the release's own predicates in the chain's order:
each `_is_X` method's source is compiled from the wheel and called, and an exception it raises on those args (0.5.9-0.5.11's
`_is_dynamic_token_w8a8` reads `input_quant.num_bits` of a weight-only config's `None`) is the release's refusal, as
is the chain's final `raise`. A predicate needing anything but compressed-tensors' enums and a few pure builtins (PURE:
no other builtin is in scope), one with a decorator or default (evaluated when defined), one reading the config
instance (`self.X`: the tool builds none, so its AttributeError is not the release's), or a chain of another shape,
stops the tool (read it anew). Recorded: {"compressed-tensors": {algorithm: {"error", "where"}}}, the algorithms the
release refuses; a branch taken that returns a scheme records nothing. Imports nothing from ``repair``.
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import json
import re
import sys
import zipfile
from pathlib import Path

from tools.sglang_expert_scales import DATA, write_from_wheels

CT = "sglang/srt/layers/quantization/compressed_tensors/compressed_tensors.py"
CLASS, METHOD = "CompressedTensorsConfig", "get_moe_scheme"
ALGORITHMS = {"W4A16_NVFP4": "NVFP4A16"}  # the config's algorithm (repair's name) -> compressed-tensors' preset


def _predicate(test: ast.expr) -> str | None:
    """`self._is_X(weight_quant, input_quant)`: X's method name; anything else None."""
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute) and test.func.attr.startswith("_is_") \
            and getattr(test.func.value, "id", None) == "self" \
            and [getattr(a, "id", None) for a in test.args] == ["weight_quant", "input_quant"] and not test.keywords:
        return test.func.attr
    return None


def chain(fn: ast.FunctionDef) -> list[tuple[str | None, list[ast.stmt], int]]:
    """The method's if/elif chain on its predicates: [(predicate, body, line)], the final else as (None, body, line)."""
    head = next((n for n in fn.body if isinstance(n, ast.If) and _predicate(n.test) == "_is_wNa16_group_channel"), None)
    if head is None:
        raise SystemExit(f"{CT}: {METHOD} has no `if self._is_wNa16_group_channel(weight_quant, input_quant)` chain")
    out, node = [], head
    while isinstance(node, ast.If):
        name = _predicate(node.test)
        if name is None:
            raise SystemExit(f"{CT}:{node.lineno}: {METHOD}'s chain tests `{ast.unparse(node.test)}`: read it anew")
        out.append((name, node.body, node.lineno))
        node = node.orelse[0] if len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If) else \
            ast.Module(node.orelse, []) if node.orelse else None
    if node is None:
        raise SystemExit(f"{CT}: {METHOD}'s chain has no final else")
    out.append((None, node.body, node.body[0].lineno))
    return out


def predicates(cls: ast.ClassDef) -> type:
    """A class holding the release's own `_is_*` methods, compiled from its source against compressed-tensors' enums."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy, QuantizationType
    from pydantic import BaseModel

    space = {"QuantizationArgs": QuantizationArgs, "QuantizationStrategy": QuantizationStrategy,
             "QuantizationType": QuantizationType, "BaseModel": BaseModel, "__builtins__": PURE}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name.startswith("_is_")):
        if fn.decorator_list or fn.args.defaults or any(fn.args.kw_defaults):  # evaluated when defined: nothing runs
            raise SystemExit(f"{CT}:{fn.lineno}: {fn.name} has a decorator or default: read it anew")
        code = compile(ast.Module([fn], []), CT, "exec", flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, space)  # the release's predicate, as written (its line numbers kept for the traceback)
    return type("Predicates", (), {**{k: v for k, v in space.items() if k.startswith("_is_")}, "__getattr__": _unbuilt})


PURE = {"bool": bool, "str": str, "int": int, "isinstance": isinstance, "len": len, "any": any, "all": all}


class Unbuilt(Exception):
    """A predicate read an attribute of the config instance, which the tool does not build."""


def _unbuilt(self, attr: str):
    raise Unbuilt(attr)


def _raised(body: list[ast.stmt]) -> str | None:
    """The final else's `raise E(f"...")`, its text with each placeholder shown as `...`."""
    exc = next((n.exc for s in body for n in ast.walk(s) if isinstance(n, ast.Raise)), None)
    if not (isinstance(exc, ast.Call) and isinstance(exc.func, ast.Name) and exc.args):
        return None
    arg = exc.args[0]
    parts = [v.value if isinstance(v, ast.Constant) else "..." for v in getattr(arg, "values", [arg])]
    return f"{exc.func.id}: {''.join(str(p) for p in parts)}"


def preset_args(preset: str):
    """(weight_quant, input_quant) as compressed-tensors' own preset writes them (llm-compressor's config groups)."""
    from compressed_tensors.quantization import preset_name_to_scheme

    scheme = preset_name_to_scheme(preset, ["Linear"])
    return scheme.weights, scheme.input_activations


def ask(asked, name: str, weight_quant, input_quant) -> str:
    """One predicate of the release on the args: "holds", "fails", or "raises <its error>"."""
    if not any(name in vars(k) for k in type(asked).__mro__):
        raise SystemExit(f"{CT}: {METHOD} asks {name}, which {CLASS} does not define")
    try:
        return "holds" if getattr(asked, name)(weight_quant, input_quant) else "fails"
    except Unbuilt as exc:
        raise SystemExit(f"{CT}: {name} reads the config's self.{exc} (the tool builds no config): read it anew") from None
    except NameError as exc:
        raise SystemExit(f"{CT}: {name} needs more than compressed-tensors' enums ({exc}): read it anew") from None
    except (AttributeError, TypeError) as exc:
        return f"raises {type(exc).__name__}: {exc}"


def method(tree: ast.Module) -> tuple[ast.ClassDef, ast.FunctionDef]:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD), None) if cls else None
    if fn is None:
        raise SystemExit(f"{CT}: no {CLASS}.{METHOD}")
    return cls, fn


def outcomes(tree: ast.Module, preset: str) -> dict[str, str]:
    """Every predicate of the chain, asked of the preset's args whatever the others answer (the SGLang tier compares
    them with the release's own methods)."""
    cls, fn = method(tree)
    asked = predicates(cls)()
    return {name: ask(asked, name, *preset_args(preset)) for name, _, _ in chain(fn) if name is not None}


def refusal(tree: ast.Module, preset: str, admitted: bool = True) -> dict | None:
    """{"error", "where"} where the release's chain refuses the preset's config, else None (`admitted` False: as the
    release's scheme map stores a group whose format its gate does not admit, without input activations)."""
    cls, fn = method(tree)
    asked = predicates(cls)()
    args = preset_args(preset) if admitted else (preset_args(preset)[0], None)
    for name, body, line in chain(fn):
        if name is None:
            error = _raised(body)
            if error is None:
                raise SystemExit(f"{CT}:{line}: {METHOD}'s final else raises nothing readable: read it anew")
            return {"error": error, "where": f"{CT}:{line} {CLASS}.{METHOD} (no predicate of its chain holds)"}
        said = ask(asked, name, *args)
        if said.startswith("raises "):
            return {"error": said[len("raises "):], "where": f"{CT}:{line} {CLASS}.{METHOD} asks {name}"}
        if said == "holds":
            if not any(isinstance(n, ast.Return) for s in body for n in ast.walk(s)):
                raise SystemExit(f"{CT}:{line}: {name} holds for {preset} and its branch returns no scheme: read it anew")
            return None
    raise AssertionError("the chain ends with its else")


def read_tree(tree: ast.Module, utils: ast.Module | None = None) -> dict:
    """{"compressed-tensors": {algorithm: refusal}} for one release's compressed_tensors.py; with its compressed-tensors
    utils.py, also each group scheme of a `mixed-precision` config ("<algorithm> in mixed-precision", as
    tools/sglang_linear_schemes.py: the format the release's scheme map reads for the group, its gate asked of it)."""
    from tools.sglang_linear_schemes import GROUPS, MIXED, gate_formats, map_reads

    facts = {algo: r for algo, preset in ALGORITHMS.items() if (r := refusal(tree, preset)) is not None}
    if utils is not None:
        reads, admits = map_reads(method(tree)[0]), gate_formats(utils)
        facts |= {f"{algo} in {MIXED}": r for algo, (preset, fmt) in GROUPS.items()
                  if (r := refusal(tree, preset, (fmt if reads == "group" else MIXED) in admits)) is not None}
    return {"compressed-tensors": facts} if facts else {}


def read_wheel(path: Path) -> tuple[str, str, dict]:
    """(release, the wheel's sha256, the block) of one SGLang wheel."""
    from tools.sglang_linear_schemes import UTILS

    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    with zipfile.ZipFile(path) as wheel:
        tree, utils = ast.parse(wheel.read(CT).decode()), ast.parse(wheel.read(UTILS).decode())
    return release, hashlib.sha256(path.read_bytes()).hexdigest(), read_tree(tree, utils)


def _version(release: str) -> tuple[int, ...]:
    return tuple(int(p) for p in release.split("."))


def mark_built(argv: list[str], key: str = "moe_scheme_refused", read=None) -> None:
    """Each wheel's release (one no file ships) into `built_by` of every fact of the `key` block of the newest file
    below it it builds (`read`: the wheel reader of that block, this tool's by default)."""
    shipped = sorted((_version(p.stem.split("-", 1)[1]), p) for p in DATA.glob("sglang-*.json"))
    for arg in sorted(argv, key=lambda a: _version(re.search(r"sglang-([0-9.]+)-", Path(a).name).group(1))):
        release, _, block = (read or read_wheel)(Path(arg))
        below = [p for v, p in shipped if v <= _version(release)]
        if not below:
            raise SystemExit(f"{arg}: no sglang file ships at or below {release}")
        doc = json.loads(below[-1].read_text(encoding="utf-8"))
        for method, algos in doc["rules"].get(key, {}).items():
            for algo, fact in algos.items():
                if algo not in block.get(method, {}):
                    fact["built_by"] = sorted({*fact.get("built_by", ()), release}, key=_version)
        below[-1].write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
        print(f"read {release} against {below[-1].name}: {json.dumps(block)[:200]}")


def main(argv: list[str]) -> int:
    own = [a for a in argv if (DATA / f"sglang-{re.search(r'sglang-([0-9.]+)-', Path(a).name).group(1)}.json").exists()]
    code = write_from_wheels(own, "moe_scheme_refused", read_wheel)
    mark_built([a for a in argv if a not in own])
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
