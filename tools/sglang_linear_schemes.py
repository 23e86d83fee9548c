"""The `linear_scheme_refused` block of repair/targets/data/sglang-<release>.json, read from the release's wheel.

    python -m tools.sglang_linear_schemes /tmp/sgl/sglang-0.5.9-*.whl [...]   (rewrites that block of each release's file)

As tools/sglang_moe_schemes.py does for the MoE layer, for every other quantized layer: SGLang builds a compressed-
tensors Linear with the scheme `CompressedTensorsConfig._get_scheme_from_parts` picks from the layer's config group
(compressed_tensors.py, asked by `get_linear_scheme` while the layer is built). Its shape is not an elif chain: a run
of `if self._is_X(weight_quant, input_quant): ... return` statements, some inside `if is_activation_quantization_format
(quant_format):` (that gate's format list read from the wheel's compressed_tensors/utils.py, asked of the format
llm-compressor writes for the preset), ending in a `raise`. The release's own predicates are compiled and asked in that
order on compressed-tensors' preset, under the same guards (sglang_moe_schemes.predicates/ask); an exception one raises
(0.5.9-0.5.21's `_is_static_tensor_w8a8` reads `input_quant.num_bits` of a weight-only config's `None`) or the final
raise is the release's refusal. Any other statement met before the answer stops the tool (read it anew). Wheels of
releases no file ships mark `built_by` as the MoE tool does. Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import hashlib
import re
import sys
import zipfile
from pathlib import Path

from tools.sglang_expert_scales import write_from_wheels
from tools.sglang_moe_schemes import CLASS, CT, _predicate, _raised, ask, mark_built, predicates, preset_args

UTILS = "sglang/srt/layers/quantization/compressed_tensors/utils.py"
METHOD, GATE = "_get_scheme_from_parts", "is_activation_quantization_format"
# the config's algorithm (repair's name) -> (compressed-tensors' preset, the format llm-compressor writes for it)
ALGORITHMS = {"W4A16_NVFP4": ("NVFP4A16", "nvfp4-pack-quantized")}


def gate_formats(utils: ast.Module) -> frozenset[str]:
    """The formats `is_activation_quantization_format` admits: its list of `CompressionFormat.X.value`."""
    from compressed_tensors.config import CompressionFormat

    fn = next((n for n in utils.body if isinstance(n, ast.FunctionDef) and n.name == GATE), None)
    lists = [n for n in ast.walk(fn) if isinstance(n, ast.List)] if fn else []
    if len(lists) != 1 or not all(isinstance(e, ast.Attribute) and e.attr == "value" and isinstance(e.value, ast.Attribute)
                                  and getattr(e.value.value, "id", None) == "CompressionFormat" for e in lists[0].elts):
        raise SystemExit(f"{UTILS}: {GATE} is not one list of CompressionFormat.X.value: read it anew")
    return frozenset(CompressionFormat[e.value.attr].value for e in lists[0].elts)


def _is_gate(test: ast.expr) -> bool:
    return isinstance(test, ast.Call) and getattr(test.func, "id", None) == GATE and len(test.args) == 1 \
        and ast.unparse(test.args[0]) in ("quant_format", "self.quant_format") and not test.keywords


def _is_format_choice(stmt: ast.stmt) -> bool:
    """0.5.12+'s `quant_format = format if format is not None else self.quant_format` (the group's or the config's)."""
    return ast.unparse(stmt) == "quant_format = format if format is not None else self.quant_format"


def walk(body: list[ast.stmt], asked, args: tuple, admitted: bool) -> dict | str | None:
    """"built", the refusal {"error", "where"}, or None where the statements end without an answer."""
    for stmt in body:
        if isinstance(stmt, ast.If) and not stmt.orelse and (name := _predicate(stmt.test)):
            said = ask(asked, name, *args)
            if said.startswith("raises "):
                return {"error": said[len("raises "):], "where": f"{CT}:{stmt.lineno} {CLASS}.{METHOD} asks {name}"}
            if said == "holds":
                if not any(isinstance(n, ast.Return) for s in stmt.body for n in ast.walk(s)):
                    raise SystemExit(f"{CT}:{stmt.lineno}: {name} holds and its branch returns no scheme: read it anew")
                return "built"
        elif isinstance(stmt, ast.If) and not stmt.orelse and _is_gate(stmt.test):
            if admitted and (answer := walk(stmt.body, asked, args, admitted)) is not None:
                return answer
        elif isinstance(stmt, ast.Raise):
            if (error := _raised([stmt])) is None:
                raise SystemExit(f"{CT}:{stmt.lineno}: {METHOD} raises nothing readable: read it anew")
            return {"error": error, "where": f"{CT}:{stmt.lineno} {CLASS}.{METHOD} (no predicate before it holds)"}
        elif not _is_format_choice(stmt):
            raise SystemExit(f"{CT}:{stmt.lineno}: {METHOD} does `{ast.unparse(stmt)[:80]}` before it answers: read it anew")
    return None


def refusal(tree: ast.Module, utils: ast.Module, preset: str, fmt: str) -> dict | None:
    """{"error", "where"} where the release's linear scheme choice refuses the preset written in `fmt`, else None."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD), None) if cls else None
    if fn is None:
        raise SystemExit(f"{CT}: no {CLASS}.{METHOD}")
    answer = walk(fn.body, predicates(cls)(), preset_args(preset), fmt in gate_formats(utils))
    if answer is None:
        raise SystemExit(f"{CT}:{fn.lineno}: {METHOD} ends without an answer for {preset}: read it anew")
    return None if answer == "built" else answer


def read_wheel(path: Path) -> tuple[str, str, dict]:
    """(release, the wheel's sha256, {"compressed-tensors": {algorithm: refusal}}) of one SGLang wheel."""
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    with zipfile.ZipFile(path) as wheel:
        tree, utils = ast.parse(wheel.read(CT).decode()), ast.parse(wheel.read(UTILS).decode())
    facts = {algo: r for algo, (preset, fmt) in ALGORITHMS.items() if (r := refusal(tree, utils, preset, fmt)) is not None}
    return release, hashlib.sha256(path.read_bytes()).hexdigest(), {"compressed-tensors": facts} if facts else {}


def main(argv: list[str]) -> int:
    from tools.sglang_expert_scales import DATA

    own = [a for a in argv if (DATA / f"sglang-{re.search(r'sglang-([0-9.]+)-', Path(a).name).group(1)}.json").exists()]
    code = write_from_wheels(own, "linear_scheme_refused", read_wheel)
    mark_built([a for a in argv if a not in own], "linear_scheme_refused", read_wheel)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
