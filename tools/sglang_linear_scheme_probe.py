"""Run SGLang's own compressed-tensors Linear scheme choice on a weight-only NVFP4 config (CPU) and print, as one JSON
line, what tools/sglang_linear_schemes.py needs judged: each predicate `_get_scheme_from_parts` asks, in its order up
to the first that answers, as the release's own method answers it and as the tool's compiled copy does; the scheme (or
error) the method gives, as shipped and with its weight-only branch's predicate answering False (what a release
without that branch runs); and the tool's own reading of the installed source. Runs in SGLang's venv; imports nothing
from the repo's `repair`.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import sglang_stubs  # noqa: E402

sglang_stubs.install()

from tools.sglang_linear_schemes import ALGORITHMS, GROUPS, METHOD, MIXED, gate_formats, refusal, walk  # noqa: E402
from tools.sglang_moe_schemes import CLASS, _predicate, ask, predicates, preset_args  # noqa: E402
from tools.raised_by import reraise_ours  # noqa: E402

WEIGHT_ONLY = "_is_fp4a16_nvfp4"  # the branch 0.5.22+ has and 0.5.9-0.5.21 lack


def scheme(config, weights, inputs) -> str:
    try:
        return type(getattr(config, METHOD)(weights, inputs)).__name__
    except Exception as exc:  # noqa: BLE001 - the release's own refusal is the answer
        reraise_ours(exc)
        return f"raises {type(exc).__name__}: {exc}"


def main() -> dict:
    from sglang.srt.layers.quantization.compressed_tensors import compressed_tensors as module
    from sglang.srt.layers.quantization.compressed_tensors import utils

    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    utils_tree = ast.parse(Path(utils.__file__).read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS)
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == METHOD)
    out = {}
    for algo, (preset, fmt) in ALGORITHMS.items():
        weights, inputs = preset_args(preset)
        config = module.CompressedTensorsConfig.from_config({
            "quant_method": "compressed-tensors", "format": fmt, "ignore": ["lm_head"],
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights.model_dump(mode="json"),
                                          "input_activations": inputs, "format": fmt}}})
        compiled, real = {}, {}
        for name in order(fn):
            real[name] = ask(config, name, weights, inputs)
            compiled[name] = ask(predicates(cls)(), name, weights, inputs)
            if real[name] != "fails":
                break
        shipped = scheme(config, weights, inputs)
        setattr(config, WEIGHT_ONLY, lambda *args: False)  # this instance only: the method without that branch
        out[algo] = {"real": real, "compiled": compiled, "scheme": shipped, "without": scheme(config, weights, inputs),
                     "read": refusal(tree, utils_tree, preset, fmt), "stubs_called": list(sglang_stubs.CALLED)}
    out["mixed"] = {algo: mixed(module, tree, utils_tree, cls, fn, preset, fmt) for algo, (preset, fmt) in GROUPS.items()}
    return out


def mixed(module, tree, utils_tree, cls, fn, preset: str, fmt: str) -> dict:
    """One group scheme in a `mixed-precision` config, through the release's own from_config: with the group's own
    format (what 0.5.23's scheme map reads), the input args its map stores and the predicate that answers, against the
    tool's reading; without it (the top-level format read, as 0.5.9-0.5.16 read every group), the args its map stores
    and what its `_get_scheme_from_parts` does with them, against the tool's walk with the gate shut."""
    weights, inputs = preset_args(preset)
    group = {"targets": ["Linear"], "weights": weights.model_dump(mode="json"),
             "input_activations": inputs.model_dump(mode="json") if inputs is not None else None}
    out = {}
    for reads, own in (("group", {"format": fmt}), ("config", {})):
        config = module.CompressedTensorsConfig.from_config({"quant_method": "compressed-tensors", "format": MIXED,
                                                             "config_groups": {"group_0": {**group, **own}}, "ignore": []})
        stored = config.target_scheme_map["Linear"]
        args = (stored["weights"], stored["input_activations"])
        answer = next((f"{name} {said}" for name in order(fn) if (said := ask(config, name, *args)) != "fails"), "none holds")
        admitted = (fmt if reads == "group" else MIXED) in gate_formats(utils_tree)
        out[reads] = {"inputs_kept": args[1] is not None, "answers": answer,
                      "real": scheme_of(config, *args, stored.get("format")),
                      "tool": refusal(tree, utils_tree, preset, fmt, MIXED) if reads == "group"
                      else walk(fn.body, predicates(cls)(), (weights, None), admitted)}
    return out


def order(fn) -> list[str]:
    """The predicates the method asks, in its order."""
    return list(dict.fromkeys(p for n in ast.walk(fn) if isinstance(n, ast.If) and (p := _predicate(n.test))))


def scheme_of(config, weights, inputs, fmt) -> str:
    try:
        return type(getattr(config, METHOD)(weights, inputs, format=fmt)).__name__
    except Exception as exc:  # noqa: BLE001 - the release's own refusal (or this host's CUDA query) is the answer
        reraise_ours(exc)
        return f"raises {type(exc).__name__}: {exc}"


if __name__ == "__main__":
    print(json.dumps(main()))
