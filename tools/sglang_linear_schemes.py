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
NVFP4_FORMAT, FP8_FORMAT, MIXED = "nvfp4-pack-quantized", "float-quantized", "mixed-precision"
# the config's algorithm (repair's name) -> (compressed-tensors' preset, the format llm-compressor writes for it)
ALGORITHMS = {"W4A16_NVFP4": ("NVFP4A16", NVFP4_FORMAT)}
# every group scheme repair reads (formats/ct_groups.py group_algorithm), asked as one group, carrying its own format, of
# a config whose top-level format is `mixed-precision` (compressed-tensors' when the groups' formats differ): recorded
# as "<algorithm> in mixed-precision"
GROUPS = {"NVFP4": ("NVFP4", NVFP4_FORMAT), "W4A16_NVFP4": ("NVFP4A16", NVFP4_FORMAT), "FP8": ("FP8", FP8_FORMAT),
          "FP8_BLOCK": ("FP8_BLOCK", FP8_FORMAT)}
MAP = "_quantization_scheme_map_from_config"
# the format the scheme map's gate asks about, as each release writes it: the config's, or the group's own first
READS = {"quant_format": "config", "group_format if group_format is not None else quant_format": "group"}


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


ARG_NAMES = {"weight_quant", "input_quant", "QuantizationType", "QuantizationStrategy"}


def _flag(stmt: ast.stmt) -> str | None:
    """`name = <expression of the args and compressed-tensors' enums only>` (0.5.22's `is_non_nvfp4_fp4a4`): its name."""
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) and all(
            n.id in ARG_NAMES for n in ast.walk(stmt.value) if isinstance(n, ast.Name)) and not any(
            isinstance(n, (ast.Call, ast.Lambda, ast.NamedExpr)) for n in ast.walk(stmt.value)):
        return stmt.targets[0].id
    return None


def _value(expr: ast.expr, args: tuple):
    from compressed_tensors.quantization import QuantizationStrategy, QuantizationType

    space = {"weight_quant": args[0], "input_quant": args[1], "QuantizationType": QuantizationType,
             "QuantizationStrategy": QuantizationStrategy, "__builtins__": {}}
    return eval(compile(ast.Expression(expr), CT, "eval"), space)  # noqa: S307 - names and attribute reads only (_flag)


def walk(body: list[ast.stmt], asked, args: tuple, admitted: bool, flags: dict | None = None) -> dict | str | None:
    """"built", the refusal {"error", "where"}, or None where the statements end without an answer."""
    flags = {} if flags is None else flags
    for stmt in body:
        if (name := _flag(stmt)) is not None:
            flags[name] = bool(_value(stmt.value, args))
            continue
        if isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.test, ast.Name) and stmt.test.id in flags:
            if flags[stmt.test.id]:
                if (error := _raised(stmt.body)) is None or len(stmt.body) != 1:
                    raise SystemExit(f"{CT}:{stmt.lineno}: `if {stmt.test.id}:` does more than raise: read it anew")
                return {"error": error, "where": f"{CT}:{stmt.lineno} {CLASS}.{METHOD} ({stmt.test.id} holds)"}
            continue
        if isinstance(stmt, ast.If) and not stmt.orelse and (name := _predicate(stmt.test)):
            said = ask(asked, name, *args)
            if said.startswith("raises "):
                return {"error": said[len("raises "):], "where": f"{CT}:{stmt.lineno} {CLASS}.{METHOD} asks {name}"}
            if said == "holds":
                if not any(isinstance(n, ast.Return) for s in stmt.body for n in ast.walk(s)):
                    raise SystemExit(f"{CT}:{stmt.lineno}: {name} holds and its branch returns no scheme: read it anew")
                return "built"
        elif isinstance(stmt, ast.If) and not stmt.orelse and _is_gate(stmt.test):
            if admitted and (answer := walk(stmt.body, asked, args, admitted, flags)) is not None:
                return answer
        elif isinstance(stmt, ast.Raise):
            if (error := _raised([stmt])) is None:
                raise SystemExit(f"{CT}:{stmt.lineno}: {METHOD} raises nothing readable: read it anew")
            return {"error": error, "where": f"{CT}:{stmt.lineno} {CLASS}.{METHOD} (no predicate before it holds)"}
        elif not _is_format_choice(stmt):
            raise SystemExit(f"{CT}:{stmt.lineno}: {METHOD} does `{ast.unparse(stmt)[:80]}` before it answers: read it anew")
    return None


def map_reads(cls: ast.ClassDef) -> str:
    """Which format the release's scheme map gates a group's input activations on (`MAP`'s one call of the gate):
    "config" (the top-level format only) or "group" (the group's own, else the config's)."""
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == MAP), None)
    calls = [ast.unparse(n.args[0]) for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == GATE
             and len(n.args) == 1] if fn else []
    if len(calls) != 1 or calls[0] not in READS:
        raise SystemExit(f"{CT}: {CLASS}.{MAP} gates on {calls}, not one format this tool reads: read it anew")
    return READS[calls[0]]


def refusal(tree: ast.Module, utils: ast.Module, preset: str, fmt: str, config_format: str | None = None) -> dict | None:
    """{"error", "where"} where the release's linear scheme choice refuses the preset written in `fmt` (a group's format)
    in a config whose top-level format is `config_format` (`fmt` itself by default), else None. The format read is the
    one the release's scheme map reads (`map_reads`); where its gate does not admit it, the map stores no input
    activations, as the release does."""
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD), None) if cls else None
    if fn is None:
        raise SystemExit(f"{CT}: no {CLASS}.{METHOD}")
    reads = map_reads(cls) if config_format not in (None, fmt) else "group"
    if reads == "group" and config_format not in (None, fmt) and not any(_is_format_choice(s) for s in fn.body):
        raise SystemExit(f"{CT}: {MAP} reads the group's format and {METHOD} does not: read it anew")
    admitted = (fmt if reads == "group" else config_format) in gate_formats(utils)
    weights, inputs = preset_args(preset)
    answer = walk(fn.body, predicates(cls)(), (weights, inputs if admitted else None), admitted)
    if answer is None:
        raise SystemExit(f"{CT}:{fn.lineno}: {METHOD} ends without an answer for {preset}: read it anew")
    return None if answer == "built" else answer


def read_wheel(path: Path) -> tuple[str, str, dict]:
    """(release, the wheel's sha256, {"compressed-tensors": {algorithm: refusal}}) of one SGLang wheel."""
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    with zipfile.ZipFile(path) as wheel:
        tree, utils = ast.parse(wheel.read(CT).decode()), ast.parse(wheel.read(UTILS).decode())
    facts = {algo: r for algo, (preset, fmt) in ALGORITHMS.items() if (r := refusal(tree, utils, preset, fmt)) is not None}
    facts |= {f"{algo} in {MIXED}": r for algo, (preset, fmt) in GROUPS.items()
              if (r := refusal(tree, utils, preset, fmt, MIXED)) is not None}
    return release, hashlib.sha256(path.read_bytes()).hexdigest(), {"compressed-tensors": facts} if facts else {}


def main(argv: list[str]) -> int:
    from tools.sglang_expert_scales import DATA

    own = [a for a in argv if (DATA / f"sglang-{re.search(r'sglang-([0-9.]+)-', Path(a).name).group(1)}.json").exists()]
    code = write_from_wheels(own, "linear_scheme_refused", read_wheel)
    mark_built([a for a in argv if a not in own], "linear_scheme_refused", read_wheel)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
