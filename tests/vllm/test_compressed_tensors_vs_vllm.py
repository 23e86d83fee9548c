"""compressed-tensors NVFP4 checkpoints against vLLM's own drafter loader: doctor's predictions and fix's output.

The fixture is the buggy ModelOpt export converted by compressed-tensors' own converter
(tests/conftest.py `ct_export`). vLLM 0.32 reads its `quant_method: compressed-tensors` config,
matches `ignore` entries exactly or by `re:` pattern on `draft_model.` names, and allocates
`weight_packed` / `weight_global_scale` / `input_global_scale` for quantized layers.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil

import pytest

from .probe import requires_vllm, needs_legacy, run_probe

pytestmark = [pytest.mark.vllm, requires_vllm]

from repair.cli import main as ckpt_repair  # noqa: E402
from repair.targets.vllm_loader import vllm_name  # noqa: E402

HANDSHAKE = ("pre_projection", "post_projection")


def cli(*args) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            ckpt_repair([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue()


def doctor(folder, target: str) -> dict:
    return json.loads(cli("doctor", folder, "--target", target, "--json")[1])


@pytest.fixture(scope="module")
def folders(ct_export, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("ct_vllm")
    out = {"converted": ct_export, "fixed": root / "fixed", "bf16": root / "bf16", "plain-ignore": root / "plain-ignore"}
    assert cli("fix", ct_export, "-o", out["fixed"], "--quiet")[0] == 0
    assert cli("fix", ct_export, "-o", out["bf16"], "--quiet", "--target", "bf16")[0] == 0
    shutil.copytree(out["fixed"], out["plain-ignore"])
    config = json.loads((out["plain-ignore"] / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", *HANDSHAKE]  # ModelOpt-style names: no match under compressed-tensors
    (out["plain-ignore"] / "config.json").write_text(json.dumps(config))
    listed = root / "trtllm-listed"  # an export already listing TensorRT-LLM < 1.3's plain name, fixed for both
    shutil.copytree(ct_export, listed)
    config = json.loads((listed / "config.json").read_text())
    config["quantization_config"]["ignore"] = ["lm_head", "post_projection"]
    (listed / "config.json").write_text(json.dumps(config))
    out["multi"] = root / "multi"
    assert cli("fix", listed, "-o", out["multi"], "--quiet", "--target", "vllm==0.32.0,trtllm==1.2.0")[0] == 0
    return out


@pytest.fixture(scope="module")
def installed(folders) -> dict:
    names = list(folders)
    return dict(zip(names, run_probe([folders[n] for n in names], "installed", 1, 0, hash_=False)))


def _head_and_set(message: str) -> tuple[str, frozenset]:
    """vLLM prints a Python set, whose order varies: compare the head and the members."""
    head, _, members = message.partition("{")
    return head, frozenset(m.strip() for m in members.rstrip("}").split(",")) if members else frozenset()


@pytest.mark.parametrize("name", ["converted", "fixed", "bf16", "multi"])
def test_what_doctor_says_loads_loads(installed, folders, name):
    result = installed[name]
    assert result["ok"], result
    assert doctor(folders[name], "vllm==0.32.0")["runtime_stops_at"] == []


@pytest.mark.parametrize("name", ["fixed", "multi"])
def test_fixed_handshake_layers_are_built_bf16_with_the_dequantized_shape(installed, name):
    params = installed[name]["params"]
    for module, shape in (("pre_projection", [64, 192]), ("post_projection", [96, 64])):
        assert params[vllm_name(f"{module}.weight")] == {"dtype": "bfloat16", "shape": shape}
        assert not [p for p in params if p.startswith(vllm_name(module) + ".") and not p.endswith(".weight")]
    assert params["model.layers.0.mlp.down_proj.weight_packed"]["dtype"] == "uint8"  # the rest stays NVFP4


def test_plain_names_in_ignore_stop_vllm_where_doctor_says(installed, folders):
    result = installed["plain-ignore"]
    assert not result["ok"]
    stops = doctor(folders["plain-ignore"], "vllm==0.32.0")["runtime_stops_at"]
    assert [s["rank"] for s in stops] == [0]
    assert _head_and_set(stops[0]["error"]) == _head_and_set(f"{result['error_type']}: {result['error']}")


@needs_legacy
def test_legacy_vllm_never_loads_the_packed_weights_doctor_names(folders):
    """0.21-0.24 build every drafter linear BF16 and skip `weight_packed`: with weights tracking vLLM names them."""
    converted, bf16 = run_probe([folders["converted"], folders["bf16"]], "legacy", 1, 0, hash_=False)
    assert bf16["ok"], bf16
    assert not converted["ok"] and converted["error"].startswith("Following weights were not initialized from checkpoint: ")
    named = set(re.findall(r"'([^']+)\.weight'", converted["error"]))
    report = doctor(folders["converted"], "vllm==0.22.1")
    flagged = {vllm_name(f["subject"] + ".weight")[: -len(".weight")] for f in report["findings"]
               if f["code"] == "silent-garbage" and "never loaded" in f["message"]}
    assert named == flagged and len(named) == 12 - 2  # gate/up load into one fused gate_up_proj
    assert report["runtime_stops_at"] == [] and report["exit_code"] == 1
