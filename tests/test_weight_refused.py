"""The profile's `weight_refused`: what a release's own load_weights raises on, fed one module at a time
(tools/vllm_load_facts.py placed_weights), read by doctor as the error vLLM raises where the checkpoint stores those
tensors (arch/load_refusals.py, doctor/config_builds.py unexpected_tensor_findings). vLLM 0.28 and 0.30 build
Kimi-Linear's layer 0 as a dense MLP (`mlp.*`, first_k_dense_replace) and look transformers 5.25's `block_sparse_moe.*`
names of that layer up in params_dict (kimi_k3/nvidia/model.py): KeyError. It was recorded, and read by no check.
(MiniCPM-MoE's NVFP4 experts in 0.32: tests/test_variants.py; judged by vLLM's loader in
tests/vllm/test_weight_refused_vs_vllm.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair import arch
from repair.arch.load_refusals import WEIGHT_REMEDY
from tests.conftest import run_captured

HIDDEN = 64


def kimi_linear(folder: Path, layer0: str) -> Path:
    """A one-layer BF16 Kimi-Linear checkpoint whose layer 0 MLP is stored under `layer0` (`block_sparse_moe`:
    transformers 5.25's save; `mlp`: the published one), every module listed in the NVFP4 config's ignore."""
    folder.mkdir(parents=True)
    tensors = {"model.embed_tokens.weight": torch.zeros(128, HIDDEN, dtype=torch.bfloat16),
               "lm_head.weight": torch.zeros(128, HIDDEN, dtype=torch.bfloat16),
               "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16)}
    for proj, shape in (("gate_proj", (128, HIDDEN)), ("up_proj", (128, HIDDEN)), ("down_proj", (HIDDEN, 128))):
        tensors[f"model.layers.0.{layer0}.{proj}.weight"] = torch.zeros(*shape, dtype=torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    modules = sorted({n.rpartition(".")[0] for n, t in tensors.items() if t.dim() == 2})
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear", "hidden_size": HIDDEN,
        "num_hidden_layers": 1, "vocab_size": 128, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": modules, "group_size": 16}}))
    return folder


def report(capsys, folder: Path, target: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json")
    assert code in (0, 1), err
    return code, json.loads(out)


@pytest.mark.parametrize("release", ["0.28.0", "0.30.0"])
def test_layer0_stored_as_moe_is_the_error_vllm_raises(capsys, tmp_path, release):
    """Failed before: doctor read no `weight_refused` and said nothing to do (exit 0)."""
    code, found = report(capsys, kimi_linear(tmp_path / "moe", "block_sparse_moe"), f"vllm=={release}")
    refused = [f for f in found["findings"] if f["code"] == "unexpected-tensor"]
    assert code == 1 and sorted(f["subject"] for f in refused) == [
        f"model.layers.0.block_sparse_moe.{p}" for p in ("down_proj", "gate_proj", "up_proj")], found["findings"]
    said = "KeyError: 'layers.0.block_sparse_moe.down_proj.weight' (vllm/models/kimi_k3/nvidia/model.py:"
    assert [s["error"][:len(said)] for s in found["runtime_stops_at"]] == [said], found["runtime_stops_at"]


@pytest.mark.parametrize("release", ["0.28.0", "0.30.0"])
def test_layer0_stored_dense_is_no_refusal(capsys, tmp_path, release):
    _, found = report(capsys, kimi_linear(tmp_path / "dense", "mlp"), f"vllm=={release}")
    assert not [f for f in found["findings"] if f["code"] == "unexpected-tensor"], found["findings"]


def test_another_runtime_borrowing_the_row_takes_none_of_it():
    """`weight_refused` is what vLLM's own load_weights does (OWN_CODE): a row borrowed for another runtime has none."""
    [profile] = [p for p in arch.PROFILES if p.runtime == "vllm" and p.release == (0, 28, 0)]
    assert profile.row("KimiLinearForCausalLM").refused_modules
    assert not profile.row("KimiLinearForCausalLM", borrowed=True).refused_modules


@pytest.mark.parametrize("recorded", [["x"], {"model.layers.*.a": 3}, {"model.layers.*.a": None}, "text"])
def test_a_malformed_record_refuses_nothing(recorded):
    from repair.arch.load_refusals import refused_loads

    assert refused_loads("vllm 0.28.0", "f.json", "A", {"weight_refused": recorded}, "", False) == ()


@pytest.mark.parametrize("error, name, said", [
    (KeyError("layers.0.mlp.ws_scale"), "model.layers.0.mlp.experts.0.w1.weight_scale", "KeyError: 'layers.*.mlp.ws_scale'"),
    (KeyError("layers.3.mlp.experts.1.w1.input_scale"), "model.layers.3.mlp.experts.1.w1.input_scale",
     "KeyError: 'layers.*.mlp.experts.*.w1.input_scale'"),
    (KeyError("layers.1.mlp.ws_scale"), "model.layers.0.mlp.experts.1.w1.weight_scale", "KeyError: 'layers.1.mlp.ws_scale'"),
    (ValueError("no parameter named 'layers.0.x' in M"), "model.layers.0.x.weight", "ValueError: no parameter named 'layers.*.x' in M"),
])
def test_a_refusal_is_recorded_with_the_names_own_layer_numbers_starred(error, name, said):
    """tools/vllm_load_facts.py refusal_text: a quoted name's numbers become `*` only where they are the fed tensor's own,
    in order (doctor puts the stored module's back); any other number is vLLM's and stays."""
    from tools.vllm_load_facts import refusal_text

    assert refusal_text(error, name) == said


@pytest.mark.parametrize("release", ["0.28.0", "0.30.0"])
def test_fix_refuses_in_one_line_with_the_refusals_own_remedy(capsys, tmp_path, release):
    """fix --target on a checkpoint whose tensors the release's load_weights raises on: one line, exit 2, nothing
    written, and the advice is the finding's own. Failed before: the line advised "set the config fields that build
    them (doctor says which)", QSA's remedy (the profile's `without`); no config field builds Kimi-Linear's layer 0
    `block_sparse_moe` (its first_k_dense_replace builds `mlp` there) and doctor names none."""
    folder = kimi_linear(tmp_path / "moe", "block_sparse_moe")
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", f"vllm=={release}")
    assert code == 2 and not (tmp_path / "out").exists(), (out, err)
    [line] = [s for s in err.splitlines() if s.strip()]
    assert "block_sparse_moe" in line and "config fields" not in line, line
    assert line.endswith(WEIGHT_REMEDY), line


class _Experts(torch.nn.Module):
    """A load_weights whose `expert_params_mapping` reads `self` inside the comprehension's element, not only in its
    outermost iterable (MiniCPMMoE's reads `self.num_experts` there alone, minicpm.py:497-506)."""

    def __init__(self):
        super().__init__()
        self.num_experts, self.stacked = 2, "ws"

    def load_weights(self, weights):
        expert_params_mapping = [(self.stacked, f"experts.{e}.{w}.weight", e) for e in range(self.num_experts)
                                 for w in ("w1", "w3")]
        return expert_params_mapping


def test_the_mapping_evaluates_as_its_function_would():
    """tools/vllm_expert_refusals.py mapping_of evaluates the list with the module as `self`: the same list its own
    load_weights builds. Failed before: `self` was handed as eval's locals, which a comprehension's own scope does not
    see on Python 3.11 (vLLM 0.32's venv), so NameError, and the module's refusals were silently not learned."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from vllm_expert_refusals import mapping_of

    module = _Experts()
    assert mapping_of(module) == [(p, w) for p, w, _ in module.load_weights(())]


class _Unevaluable(torch.nn.Module):
    """Mappings that need more than `self` and range (a local of load_weights; an index vLLM's own code would raise on)."""

    def __init__(self):
        super().__init__()
        self.names = []

    def load_weights(self, weights):
        count = 2
        expert_params_mapping = [("ws", f"experts.{e}.w1.weight", e) for e in range(count)]
        expert_params_mapping = [(self.names[0], "experts.0.w1.weight", 0)]
        return expert_params_mapping


def test_a_mapping_it_cannot_evaluate_is_said_and_learns_nothing(capsys):
    """No claim where the expression needs the function's other locals or raises: logged, so a regenerated profile that
    lost a row's refusals says why. Failed before: the local's NameError was passed over in silence, and the
    IndexError escaped mapping_of and stopped the whole generation."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
    from vllm_expert_refusals import mapping_of

    assert mapping_of(_Unevaluable()) == []
    said = capsys.readouterr().err
    assert said.count("expert_params_mapping") == 2 and "NameError" in said and "IndexError" in said, said


@pytest.mark.parametrize("release", ["0.28.0", "0.30.0"])
def test_a_quantized_refused_module_is_named_by_the_tensor_vllm_meets_first(capsys, tmp_path, release):
    """Layer 0 stored as `block_sparse_moe` NVFP4 (not ignored): vLLM reads input_scale first (safetensors' sorted
    names) and looks that raw name up in params_dict (kimi_k3/nvidia/model.py load_weights: no packed or expert mapping
    takes it, maybe_remap_kv_scale_name returns it untouched), so its KeyError quotes `...down_proj.input_scale`.
    Failed before: doctor quoted the recorded `...down_proj.weight`, the tensor the profile fed, for every leaf."""
    folder = kimi_linear(tmp_path / "moe", "block_sparse_moe")
    tensors = load_file(folder / "model.safetensors")
    for proj in ("gate_proj", "up_proj", "down_proj"):
        module = f"model.layers.0.block_sparse_moe.{proj}"
        rows, cols = tensors[f"{module}.weight"].shape
        tensors[f"{module}.weight"] = torch.zeros(rows, cols // 2, dtype=torch.uint8)
        tensors[f"{module}.weight_scale"] = torch.ones(rows, cols // 16).to(torch.float8_e4m3fn)
        tensors[f"{module}.weight_scale_2"] = torch.tensor(1.0)
        tensors[f"{module}.input_scale"] = torch.tensor(1.0)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"]["ignore"] = [m for m in config["quantization_config"]["ignore"] if "block_sparse" not in m]
    (folder / "config.json").write_text(json.dumps(config))
    _, found = report(capsys, folder, f"vllm=={release}")
    said = "KeyError: 'layers.0.block_sparse_moe.down_proj.input_scale' (vllm/models/kimi_k3/nvidia/model.py:"
    assert [s["error"][:len(said)] for s in found["runtime_stops_at"]] == [said], found["runtime_stops_at"]


def test_a_hostile_leaf_never_reaches_the_error_text(capsys, tmp_path):
    """A stored leaf holding a quote and a newline, first in load order under a refused module: the error stays the
    recorded one, on one line (no text of the file's is spliced into vLLM's words)."""
    folder = kimi_linear(tmp_path / "moe", "block_sparse_moe")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.block_sparse_moe.down_proj.a'b\nc"] = torch.zeros(2)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    _, found = report(capsys, folder, "vllm==0.28.0")
    said = "KeyError: 'layers.0.block_sparse_moe.down_proj.weight' (vllm/models/kimi_k3/nvidia/model.py:"
    assert [s["error"][:len(said)] for s in found["runtime_stops_at"]] == [said], found["runtime_stops_at"]
