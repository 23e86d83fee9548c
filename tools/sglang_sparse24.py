"""The `sparse_24_refused` block of repair/targets/data/sglang-<release>.json, read from the release's wheel.

    python -m tools.sglang_sparse24 /tmp/sgl/sglang-0.5.9-*.whl [...]   (rewrites that block of each release's file)

A compressed-tensors config may carry a `sparsity_config` (llm-compressor's 2:4 sparse models). SGLang's
`CompressedTensorsConfig.get_linear_scheme` (compressed_tensors.py) matches each Linear against its targets (less its
ignore list) with find_matched_target, and where `supports_cutlass_24(weight_quant, input_quant, sparsity_scheme)`
holds it raises (0.5.9-0.5.23: `ImportError: CompressedTensors24 is not supported now`) while the model is built,
before any weight loads; a layer it does not hold for is built by its quantization scheme, or unquantized, as without
the sparsity config. This tool compiles the release's own `supports_cutlass_24` from the wheel (compressed-tensors'
enums and config classes in scope, nothing else) and asks it, for a 2:4 sparsity config in each compression format it
lists, about each scheme repair reads a layer as (`BF16`: a layer the quantization config ignores; the group schemes
as compressed-tensors' presets write them). Recorded: {"compressed-tensors": {"error", "where", "refused": {sparsity
format: [schemes it holds for]}}}; a release without the branch, or one that holds for none, records nothing. Any other
shape of the branch or the function stops the tool (read it anew). Imports nothing from ``repair``.
"""

from __future__ import annotations

import __future__
import ast
import hashlib
import re
import sys
import zipfile
from pathlib import Path

from tools.sglang_expert_scales import write_from_wheels
from tools.sglang_moe_schemes import CLASS, CT, PURE, _raised, mark_built, preset_args

CHECK, CHOOSER = "supports_cutlass_24", "get_linear_scheme"
SCHEMES = {"BF16": None, "NVFP4": "NVFP4", "W4A16_NVFP4": "NVFP4A16", "FP8": "FP8", "FP8_BLOCK": "FP8_BLOCK"}
FORMATS = ("dense", "sparse-24-bitmask")  # the compression formats supports_cutlass_24 admits in every release read


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        raise SystemExit(f"{CT}: no {CLASS}.{name}")
    return fn


def branch(chooser: ast.FunctionDef) -> tuple[str, int]:
    """(the error, its line) of the chooser's `if self.supports_cutlass_24(...): raise ...`."""
    found = [n for n in ast.walk(chooser) if isinstance(n, ast.If) and isinstance(n.test, ast.Call)
             and ast.unparse(n.test.func) == f"self.{CHECK}"]
    if len(found) != 1 or len(found[0].body) != 1 or (error := _raised(found[0].body)) is None:
        raise SystemExit(f"{CT}: {CHOOSER} has no one `if self.{CHECK}(...): raise ...`: read it anew")
    keywords = {k.arg: ast.unparse(k.value) for k in found[0].test.keywords}
    if found[0].test.args or keywords != {"weight_quant": "weight_quant", "input_quant": "input_quant",
                                          "sparsity_scheme": "sparsity_scheme"}:
        raise SystemExit(f"{CT}:{found[0].lineno}: {CHECK} is asked another way: read it anew")
    return error, found[0].body[0].lineno


def compiled(fn: ast.FunctionDef):
    """The release's own `supports_cutlass_24`, its `@staticmethod` dropped, against compressed-tensors' classes."""
    from compressed_tensors.config import CompressionFormat, SparsityCompressionConfig, SparsityStructure
    from compressed_tensors.quantization import QuantizationArgs, QuantizationStrategy

    if [ast.unparse(d) for d in fn.decorator_list] != ["staticmethod"] or any(
            not isinstance(d, ast.Constant) for d in (*fn.args.defaults, *filter(None, fn.args.kw_defaults))):
        raise SystemExit(f"{CT}:{fn.lineno}: {CHECK} is no plain staticmethod: read it anew")
    space = {"CompressionFormat": CompressionFormat, "SparsityStructure": SparsityStructure,
             "SparsityCompressionConfig": SparsityCompressionConfig, "QuantizationArgs": QuantizationArgs,
             "QuantizationStrategy": QuantizationStrategy, "__builtins__": {**PURE, "AssertionError": AssertionError}}
    bare = ast.FunctionDef(**{**{f: getattr(fn, f) for f in fn._fields}, "decorator_list": []})
    code = compile(ast.fix_missing_locations(ast.Module([bare], [])), CT, "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, space)  # noqa: S102 - the release's function as written, in a namespace of enums and config classes
    return space[CHECK]


def holds(check, scheme: str, fmt: str) -> bool:
    from compressed_tensors.config import SparsityCompressionConfig

    weights, inputs = preset_args(SCHEMES[scheme]) if SCHEMES[scheme] else (None, None)
    sparsity = SparsityCompressionConfig.model_validate({"format": fmt, "sparsity_structure": "2:4", "targets": ["Linear"]})
    try:
        return bool(check(weight_quant=weights, input_quant=inputs, sparsity_scheme=sparsity))
    except NameError as exc:
        raise SystemExit(f"{CT}: {CHECK} needs more than compressed-tensors' classes ({exc}): read it anew") from None


def read_tree(tree: ast.Module) -> dict:
    cls = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS), None)
    if cls is None:
        raise SystemExit(f"{CT}: no {CLASS}")
    error, line = branch(_method(cls, CHOOSER))
    check = compiled(_method(cls, CHECK))
    refused = {fmt: [s for s in SCHEMES if holds(check, s, fmt)] for fmt in FORMATS}
    refused = {fmt: schemes for fmt, schemes in refused.items() if schemes}
    return {"compressed-tensors": {"error": error, "where": f"{CT}:{line} {CLASS}.{CHOOSER} ({CHECK} holds)",
                                   "refused": refused}} if refused else {}


def read_wheel(path: Path) -> tuple[str, str, dict]:
    release = re.search(r"sglang-([0-9.]+)-", path.name).group(1)
    with zipfile.ZipFile(path) as wheel:
        tree = ast.parse(wheel.read(CT).decode())
    return release, hashlib.sha256(path.read_bytes()).hexdigest(), read_tree(tree)


def main(argv: list[str]) -> int:
    from tools.sglang_expert_scales import DATA

    own = [a for a in argv if (DATA / f"sglang-{re.search(r'sglang-([0-9.]+)-', Path(a).name).group(1)}.json").exists()]
    code = write_from_wheels(own, "sparse_24_refused", read_wheel)
    for arg in argv:  # a release falling back to a file: the same fact, or the tool says so (no built_by form here)
        release, _, block = read_wheel(Path(arg))
        print(f"{release}: {block}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
