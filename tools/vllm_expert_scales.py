"""Which global scale vLLM's NVFP4 MoE methods keep for a routed expert's fused w13 (gate w1 + up w3), per release and
per quant method (run in .venv-vllm; tools/vllm_profile.py records it as the profile's `experts_gate_up_scale_2`,
{quant method: fact}, the keys `quant_method` in repair/targets/runtime_rules.py gives a checkpoint).

vLLM loads each expert's w1 and w3 global scale into column 0 and 1 of one [E, 2] parameter (FusedMoE's per-tensor
scale loader: w1 is column 0) and, in the method's `process_weights_after_loading`, gives the kernel one column:
ModelOpt's `ModelOptNvFp4FusedMoE` (modelopt_fp4, and modelopt_mixed, whose config hands NVFP4 experts the same class)
reads `w13_weight_scale_2`, compressed-tensors' `CompressedTensorsW4A4Nvfp4MoEMethod` reads `w13_weight_global_scale`
(the stored weight_global_scale, 1/scale) and logs its own warning. This reads each method's own source (ast, not text
matching): the column assigned and the warning logged when the two differ. A release whose method does anything else
(rescales the block scales, takes a max, raises) is not described by this reading: the tool stops and says so, and that
release's behaviour must be read anew. `vllm_expert_scales.py MODELOPT_PY` reads a release's modelopt.py instead, where
no venv of it is installed (then only ModelOpt's keys: the other methods are not read, that data does not say, doctor
warns; every shipped vLLM profile is now read from its installed release). The vLLM
tier (tests/vllm/test_expert_scales_vs_vllm.py) loads a checkpoint whose expert scales differ and checks the value kept.
Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import textwrap

KEPT = {0: "gate", 1: "up"}  # FusedMoE's w13 per-tensor scale columns: w1 (gate) then w3 (up)
MODELOPT = ("vllm.model_executor.layers.quantization.modelopt", "ModelOptNvFp4FusedMoE", "w13_weight_scale_2")
# quant method (runtime_rules.quant_method) -> (module, MoE method class, the [E, 2] parameter it reads)
METHODS = {"modelopt_fp4": MODELOPT, "modelopt_mixed": MODELOPT,
           "compressed-tensors": ("vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
                                  "compressed_tensors_moe_w4a4_nvfp4", "CompressedTensorsW4A4Nvfp4MoEMethod",
                                  "w13_weight_global_scale")}


def experts_gate_up_scale_2(modelopt_py: str | None = None) -> dict:
    """{quant method: {"keeps": "gate" | "up", "log": the warning logged when w1's and w3's differ, "where": the method
    read}}, from the installed vLLM; `modelopt_py`: a release's modelopt.py read from a file (then only ModelOpt's keys).
    modelopt_mixed is recorded only where the mixed config's get_quant_method builds experts with ModelOpt's class."""
    if modelopt_py is not None:
        text = open(modelopt_py, encoding="utf-8").read()
        fact = method_fact(_method(text, MODELOPT[1], "process_weights_after_loading"), *MODELOPT[1:])
        mixed = _method(text, "ModelOptMixedPrecisionConfig", "get_quant_method")
    else:
        fact, mixed = None, inspect.getsource(importlib.import_module(MODELOPT[0]).ModelOptMixedPrecisionConfig.get_quant_method)
    out = {}
    for key, (module, cls, param) in METHODS.items():
        if key == "modelopt_mixed" and not _builds(mixed, MODELOPT[1]):
            continue
        if modelopt_py is None:
            source = inspect.getsource(getattr(importlib.import_module(module), cls).process_weights_after_loading)
            out[key] = method_fact(source, cls, param, module)
        elif (module, cls, param) == MODELOPT:
            out[key] = fact
    return out


def _builds(source: str, cls: str) -> bool:
    """Whether `source` calls `cls(...)` (ast)."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == cls
               for n in ast.walk(ast.parse(textwrap.dedent(source))))


def method_fact(source: str, cls: str, param: str, module: str = MODELOPT[0]) -> dict:
    """What one method's `process_weights_after_loading` source keeps of `param` and logs."""
    where = f"{module.replace('.', '/')}.py {cls}.process_weights_after_loading"
    tree = ast.parse(textwrap.dedent(source))
    kept = {_column(node.value, param) for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == param for t in node.targets)}
    logs = {_joined(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr.startswith("warning") and call.args}
    logs = {text for text in logs if text and text.startswith("w1_")}
    if len(kept) != 1 or None in kept or len(logs) != 1:
        raise SystemExit(f"{where}: expected one column of {param} kept and one warning, found columns "
                         f"{sorted(map(str, kept))} and warnings {sorted(logs)}: read this release's method anew")
    return {"keeps": KEPT[kept.pop()], "log": logs.pop(), "where": where}


def _column(value: ast.expr, param: str) -> int | None:
    """`layer.<param>[:, N]` (optionally `.contiguous()`): N; anything else None."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "contiguous":
        value = value.func.value
    if not (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute)
            and value.value.attr == param and isinstance(value.slice, ast.Tuple)):
        return None
    index = value.slice.elts[-1]
    return index.value if isinstance(index, ast.Constant) and isinstance(index.value, int) else None


def _joined(node: ast.expr) -> str | None:
    """A string literal (adjacent literals are one constant after parsing)."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _method(text: str, cls: str, name: str) -> str:
    """The source of `cls.name` in a module's text (a release's modelopt.py from its wheel, where no venv of it is
    installed: vLLM 0.30.0's, `pip download vllm==0.30.0 --no-deps`, modelopt.py:975)."""
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == cls:
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == name:
                    return ast.get_source_segment(text, item) or ""
    raise SystemExit(f"no {cls}.{name} in the file read")


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(experts_gate_up_scale_2(sys.argv[1] if len(sys.argv) > 1 else None), indent=1))
