"""Which weight_scale_2 vLLM's ModelOpt NVFP4 MoE method keeps for a routed expert's fused w13 (gate w1 + up w3), per
release (run in .venv-vllm; tools/vllm_profile.py records it as the profile's `experts_gate_up_scale_2`).

vLLM loads each expert's w1 and w3 weight_scale_2 into `w13_weight_scale_2[:, 0]` and `[:, 1]` (FusedMoE's per-tensor
scale loader: w1 is column 0) and, in `ModelOptNvFp4FusedMoE.process_weights_after_loading`, gives the kernel one
column. This reads that method's own source (ast, not text matching): the column assigned to `w13_weight_scale_2`
(0: the gate's) and the warning it logs when the two differ. A release whose method does anything else (rescales the
block scales, takes a max, raises) is not described by this reading: the tool stops and says so, and that release's
behaviour must be read anew. `vllm_expert_scales.py MODELOPT_PY` reads a release's file instead (how the 0.30 profile,
whose venv is gone, got its entry). The vLLM tier (tests/vllm/test_expert_scales_vs_vllm.py) loads a checkpoint whose expert
scales differ and checks the value kept. Imports nothing from ``repair``.
"""

from __future__ import annotations

import ast
import inspect
import textwrap

KEPT = {0: "gate", 1: "up"}  # FusedMoE's w13 per-tensor scale columns: w1 (gate) then w3 (up)


def experts_gate_up_scale_2(source: str | None = None) -> dict:
    """{"keeps": "gate" | "up", "log": the warning logged when w1's and w3's differ, "where": the method read};
    `source`: the method's source (default: the installed vLLM's)."""
    where = "vllm/model_executor/layers/quantization/modelopt.py ModelOptNvFp4FusedMoE.process_weights_after_loading"
    if source is None:
        from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE

        source = inspect.getsource(ModelOptNvFp4FusedMoE.process_weights_after_loading)
    tree = ast.parse(textwrap.dedent(source))
    kept = {_column(node.value) for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "w13_weight_scale_2" for t in node.targets)}
    logs = {_joined(call.args[0]) for call in ast.walk(tree) if isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute) and call.func.attr.startswith("warning") and call.args}
    logs = {text for text in logs if text and "w1_weight_scale_2" in text}
    if len(kept) != 1 or None in kept or len(logs) != 1:
        raise SystemExit(f"{where}: expected one column of w13_weight_scale_2 kept and one warning, found columns "
                         f"{sorted(map(str, kept))} and warnings {sorted(logs)}: read this release's method anew")
    return {"keeps": KEPT[kept.pop()], "log": logs.pop(), "where": where}


def _column(value: ast.expr) -> int | None:
    """`layer.w13_weight_scale_2[:, N]` (optionally `.contiguous()`): N; anything else None."""
    while isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "contiguous":
        value = value.func.value
    if not (isinstance(value, ast.Subscript) and isinstance(value.value, ast.Attribute)
            and value.value.attr == "w13_weight_scale_2" and isinstance(value.slice, ast.Tuple)):
        return None
    index = value.slice.elts[-1]
    return index.value if isinstance(index, ast.Constant) and isinstance(index.value, int) else None


def _joined(node: ast.expr) -> str | None:
    """A string literal (adjacent literals are one constant after parsing)."""
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def method_source(path: str) -> str:
    """The method's source in a release's modelopt.py read from a file (a wheel's, where no venv of it is installed:
    vLLM 0.30.0's, `pip download vllm==0.30.0 --no-deps`, modelopt.py:975)."""
    text = open(path, encoding="utf-8").read()
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef) and node.name == "ModelOptNvFp4FusedMoE":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "process_weights_after_loading":
                    return ast.get_source_segment(text, item) or ""
    raise SystemExit(f"{path}: no ModelOptNvFp4FusedMoE.process_weights_after_loading")


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(experts_gate_up_scale_2(method_source(sys.argv[1]) if len(sys.argv) > 1 else None)))
