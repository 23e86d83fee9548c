"""Cases of compressed-tensors configs with config groups of different schemes: layer prefix -> the algorithm it gets.

Shared by tests/test_ct_mixed_groups.py (doctor's reading) and the tiers, which ask vLLM 0.32's and SGLang 0.5.23's own
CompressedTensorsConfig the same prefixes (tools/ct_groups_probe.py). Each case: (groups, {prefix: algorithm or None},
packed_modules_mapping, ignore). The groups are the real RedHatAI DeepSeek-V4-Flash config's two schemes, re-targeted.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

REAL = Path(__file__).parent / "data" / "real" / "redhatai-deepseek-v4-flash-nvfp4-fp8" / "config.json"
_GROUPS = json.loads(REAL.read_text())["quantization_config"]["config_groups"]
FP8, NVFP4 = _GROUPS["group_0"], _GROUPS["group_1"]
W4A16 = {k: v for k, v in NVFP4.items() if k != "input_activations"}
DSV4_PACKED = {"fused_wqa_wkv": ["wq_a", "wkv"], "gate_up_proj": ["w1", "w3"]}  # vLLM 0.32 models/deepseek_v4
LLAMA_PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


def _group(scheme: dict, *targets: str) -> dict:
    return {**copy.deepcopy(scheme), "targets": list(targets)}


CASES: dict[str, tuple[dict, dict[str, str | None], dict, list[str]]] = {
    "real-deepseek-v4": (copy.deepcopy(_GROUPS), {
        "layers.0.attn.fused_wqa_wkv": "FP8_BLOCK", "layers.0.attn.wq_b": "FP8_BLOCK", "layers.5.attn.wo_a": "FP8_BLOCK",
        "layers.42.attn.wo_b": "FP8_BLOCK", "layers.0.ffn.shared_experts.gate_up_proj": "NVFP4",
        "layers.0.ffn.shared_experts.down_proj": "NVFP4", "layers.0.attn.wq_a": None, "layers.0.ffn.gate": None,
        "head": None, "layers.0.attn.compressor.wkv": None, "mtp.0.e_proj": None}, DSV4_PACKED, []),
    "first-target-wins": ({"group_0": _group(FP8, "re:.*proj$"), "group_1": _group(NVFP4, "re:.*down_proj$")}, {
        "model.layers.0.mlp.down_proj": "FP8_BLOCK", "model.layers.0.self_attn.o_proj": "FP8_BLOCK"}, LLAMA_PACKED, []),
    "group-order-matters": ({"group_0": _group(NVFP4, "re:.*down_proj$"), "group_1": _group(FP8, "re:.*proj$")}, {
        "model.layers.0.mlp.down_proj": "NVFP4", "model.layers.0.self_attn.o_proj": "FP8_BLOCK"}, LLAMA_PACKED, []),
    "target-in-two-groups": ({"group_0": _group(FP8, "re:.*down_proj$", "re:.*o_proj$"),
                              "group_1": _group(NVFP4, "re:.*proj$", "re:.*down_proj$")}, {
        "model.layers.0.mlp.down_proj": "NVFP4", "model.layers.0.self_attn.o_proj": "FP8_BLOCK",
        "model.layers.0.self_attn.qkv_proj": "NVFP4"}, LLAMA_PACKED, []),
    "fused-by-its-shards": ({"group_0": _group(FP8, *(f"model.layers.0.self_attn.{s}_proj" for s in "qkv")),
                             "group_1": _group(NVFP4, "re:.*mlp.*")}, {
        "model.layers.0.self_attn.qkv_proj": "FP8_BLOCK", "model.layers.1.self_attn.qkv_proj": None,
        "model.layers.0.mlp.gate_up_proj": "NVFP4", "model.layers.0.self_attn.o_proj": None}, LLAMA_PACKED, []),
    "class-name-target": ({"group_0": _group(NVFP4, "Linear"), "group_1": _group(FP8, "re:.*o_proj$")}, {
        "model.layers.0.self_attn.o_proj": "FP8_BLOCK", "model.layers.0.mlp.down_proj": "NVFP4",
        "model.layers.0.self_attn.qkv_proj": "NVFP4", "model.layers.0.mlp.up_proj": None}, LLAMA_PACKED,
        ["re:.*up_proj$"]),
    "weight-only-nvfp4": ({"group_0": _group(W4A16, "re:.*mlp.*"), "group_1": _group(FP8, "re:.*self_attn.*")}, {
        "model.layers.0.mlp.down_proj": "W4A16_NVFP4", "model.layers.0.self_attn.o_proj": "FP8_BLOCK"}, LLAMA_PACKED, []),
    # the class pass re.match'es a `re:` target on the class name too (vLLM 0.32 / SGLang 0.5.23 utils.py
    # _is_equal_or_regex_match): `re:.*Linear$` names every Linear's class
    "class-regex-target": ({"group_0": _group(FP8, "re:.*o_proj$"), "group_1": _group(NVFP4, "re:.*Linear$")}, {
        "model.layers.0.self_attn.o_proj": "FP8_BLOCK", "model.layers.0.mlp.down_proj": "NVFP4",
        "model.layers.0.self_attn.qkv_proj": "NVFP4"}, LLAMA_PACKED, []),
}

# where the runtimes' pass orders differ (ct_groups.ORDERS): shards matched by group_0, every Linear by group_1
ORDER_CASE = ({"group_0": _group(FP8, *(f"model.layers.0.self_attn.{s}_proj" for s in "qkv")), "group_1": _group(NVFP4, "Linear")},
              "model.layers.0.self_attn.qkv_proj", {"vllm": "FP8_BLOCK", "sglang": "NVFP4"})


def case_config(name: str) -> dict:
    """The case's whole quantization_config: the real config's top level with the case's groups and ignore."""
    groups, _, _, ignore = CASES[name]
    return quantization_config(groups, ignore)


def quantization_config(groups: dict, ignore: list[str]) -> dict:
    qc = copy.deepcopy(json.loads(REAL.read_text())["quantization_config"])
    qc.update(config_groups=copy.deepcopy(groups), ignore=list(ignore))
    return qc


def probe_cases() -> dict:
    """tools/ct_groups_probe.py's input: every case, and the order case as "order" (its prefix a QKVParallelLinear)."""
    out = {name: {"quantization_config": case_config(name), "packed": CASES[name][2], "prefixes": list(CASES[name][1]),
                  "classes": {}} for name in CASES}
    groups, prefix, _ = ORDER_CASE
    out["order"] = {"quantization_config": quantization_config(groups, []), "packed": LLAMA_PACKED, "prefixes": [prefix],
                    "classes": {prefix: "QKVParallelLinear"}}
    return out


def algorithm_of(answer: dict | None) -> str | None:
    """The runtime's matched scheme (its weights' fields) under the tool's algorithm names (formats/ct_groups.py)."""
    if answer is None:
        return None
    from repair.formats.ct_groups import FP8_FORMAT, NVFP4_FORMAT, group_algorithm

    weights = answer["weights"]
    fmt = NVFP4_FORMAT if weights["num_bits"] == 4 else FP8_FORMAT
    return group_algorithm({"format": fmt, "weights": weights, "input_activations": answer["input_activations"] or None},
                           None, "runtime answer")


def runtime_answers(python: Path, runtime: str, folder: Path) -> dict:
    """tools/ct_groups_probe.py run with the runtime venv's `python` over `probe_cases()`: {case: {prefix: answer}}."""
    import os
    import subprocess

    cases = folder / "ct_group_cases.json"
    cases.write_text(json.dumps(probe_cases()))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "SGLANG_USE_CPU_ENGINE")}
    proc = subprocess.run([str(python), str(Path(__file__).parents[1] / "tools" / "ct_groups_probe.py"), runtime, str(cases)],
                          capture_output=True, text=True, timeout=900, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout)


def declaration_for(folder: Path, name: str, target: str):
    """The declaration `doctor --target target` reads for a case's config (written with one stand-in tensor)."""
    import torch
    from safetensors.torch import save_file

    from repair import arch, formats
    from repair.io.checkpoint import open_checkpoint
    from repair.targets.profiles import resolve

    spec = probe_cases()[name]
    config = json.loads(REAL.read_text())
    config["quantization_config"] = spec["quantization_config"]
    case = folder / name
    case.mkdir(parents=True, exist_ok=True)
    (case / "config.json").write_text(json.dumps(config))
    save_file({"x.weight": torch.zeros(2, 2)}, str(case / "model.safetensors"))
    ckpt = open_checkpoint(case)
    chosen = resolve(target)
    family = arch.architecture(ckpt.config, chosen.release)
    return chosen.bind(formats.detect(ckpt).read_declaration(ckpt), family, ckpt.config), spec


def both_sides(name: str, answers: dict, folder: Path, target: str) -> tuple[dict, dict]:
    """(doctor's answer per prefix, the runtime's) for one case: the algorithm, or where the runtime raises, its text
    and the refusal the target's bound rule predicts for that layer."""
    declaration, spec = declaration_for(folder, name, target)
    packed = {k: tuple(v) for k, v in spec["packed"].items()}
    raised = {p: a["error"] for p, a in answers[name].items() if isinstance(a, dict) and "error" in a}
    runtime = {p: raised[p] if p in raised else algorithm_of(a) for p, a in answers[name].items()}
    refusal = getattr(declaration.rule(), "fused_refusal", lambda *_: None)
    doctor = {p: declaration.algorithm(p, packed) or (refusal(p, ()) if p in raised else None) for p in spec["prefixes"]}
    return doctor, runtime


# The tier test, imported by tests/vllm/test_ct_groups_vs_vllm.py and tests/sglang/test_ct_groups_vs_sglang.py: each
# module names RUNTIME ("vllm" | "sglang"), RUNTIME_PY (its venv's python) and TARGET (the doctor target it judges).
@pytest.fixture(scope="module")
def answers(request, tmp_path_factory) -> dict:
    module = request.module
    return runtime_answers(module.RUNTIME_PY, module.RUNTIME, tmp_path_factory.mktemp(f"ct_groups_{module.RUNTIME}"))


@pytest.mark.parametrize("name", sorted(CASES) + ["order"])
def test_each_layers_scheme_is_the_runtimes(name, answers, tmp_path, request):
    doctor, runtime = both_sides(name, answers, tmp_path, request.module.TARGET)
    assert doctor == runtime
