"""vLLM 0.32's own load of float8 3-D experts stored with no leaf and no scale, in a MoE layer the config excludes
(tests/test_float8_experts_unscaled.py): fix's BF16 output of ModelOpt's tiny gpt-oss export (tools/modelopt_gptoss_export.py,
experts dequantized to transformers' `mlp.experts.gate_up_proj` layout and `...mlp.experts` excluded) with those experts
cast to float8_e4m3. vLLM builds the FusedMoE unquantized and gpt_oss.py copies the float8 codes into its BF16
parameters as values (`_load_weights_other`, gpt_oss.py:1220 and 1232: `param.copy_`, which casts): the load
succeeds, no scale is read, and the weights are the codes. doctor says so (an error
naming every such tensor) and fix refuses."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tests.conftest import run_captured

from .probe import requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]
TARGET = "vllm==0.32.0"


def _sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def test_vllm_loads_unscaled_float8_experts_as_their_codes_and_doctor_says_so(tmp_path, capsys):
    from safetensors.torch import load_file, save_file
    from tools.modelopt_gptoss_export import export_gpt_oss

    src = export_gpt_oss(tmp_path / "modelopt-gpt-oss")
    assert run_captured(capsys, "fix", "--target", TARGET, src, "-o", tmp_path / "bf16")[0] == 0
    folder = tmp_path / "bf16"
    tensors = load_file(folder / "model.safetensors")
    experts = [n for n in tensors if n.endswith((".experts.gate_up_proj", ".experts.down_proj"))]
    assert experts, sorted(tensors)
    for name in experts:
        tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "repair_report.json").unlink()

    loaded = in_vllm("vllm_load.py", folder, "--moe-emulation", "--hash")[0]
    assert loaded["ok"], loaded
    assert {m["method"] for k, m in loaded["methods"].items() if k.endswith("routed_experts")} == {"UnquantizedFusedMoEMethod"}
    for name in experts:  # the parameter holds the float8 codes as BF16 values (as stored, or transposed per expert)
        layer, leaf = name.rsplit(".experts.", 1)
        param = {"gate_up_proj": "w13_weight", "down_proj": "w2_weight"}[leaf]
        got = loaded["params"][f"{layer}.experts.routed_experts.{param}"]["sha256"]
        as_values = tensors[name].to(torch.bfloat16)
        assert got in (_sha(as_values), _sha(as_values.transpose(-1, -2))), name

    code, out, _ = run_captured(capsys, "doctor", folder, "--target", TARGET, "--json")
    found = {f["subject"] for f in json.loads(out)["findings"] if f["code"] == "unscaled-float8" and f["severity"] == "error"}
    assert code == 1 and found == set(experts), out
    code, _, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "again", "--target", TARGET)
    assert code == 2 and "unscaled-float8" in err and not (tmp_path / "again").exists(), err
