"""The vLLM 0.32 rows learned from vLLM's own model code (config class with remote code only: tools/vllm_remote_configs.py)
are judged by vLLM 0.32's own loader: for each, tools/vllm_arch_check.py writes a tiny ModelOpt NVFP4 export of the
learned config under exactly the names the row was learned from (vLLM's own, fused layers as their shards, routed
experts per expert: tools/vllm_saved_names.py own_checkpoint; under the names its mapper renames from where it renames:
published_checkpoint, Mistral Large 3's `layers.N.attention.wo`), and vLLM's load_weights places every one of them
(none rejected or skipped) and its loader fills every parameter (weights tracked). doctor and fix, on these exports and
their broken copies, are judged by tests/vllm/test_generated_archs_vs_vllm.py, which takes every shipped row (a broken
copy may load: Exaone's layers are asked under `model.` while its checkpoint names are `transformer.`, so an exclusion
of the checkpoint name reaches nothing, and doctor must say so from the row's `prefixes`).
"""

from __future__ import annotations

import json
import os

import pytest

from .probe import requires_vllm
from .test_profiles_vs_vllm import SHIPPED, in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ROWS = json.loads(SHIPPED.read_text())["architectures"]
# and Mistral Large 3, whose config is vLLM's own reader's of Mistral's params.json (tools/vllm_profile_configs.py
# mistral_format): its names are vLLM's own read back through its mapper, judged the same way
LEARNED = sorted(a for a, e in ROWS.items() if e["config"]["source"].startswith(
    ("learned from vLLM's model code", "vLLM's own reader of Mistral's params.json")))


@pytest.fixture(scope="module")
def checked(tmp_path_factory) -> dict[str, dict]:
    lines = in_vllm("vllm_arch_check.py", tmp_path_factory.mktemp("learned"), *LEARNED)
    return {line["arch"]: line for line in lines}


def test_rows_were_learned():
    assert len(LEARNED) >= 10 and "InternLM2ForCausalLM" in LEARNED and "PhiMoEForCausalLM" in LEARNED, LEARNED


@pytest.mark.parametrize("arch", LEARNED)
def test_vllm_loads_the_learned_names_and_places_every_one(checked, arch):
    line = checked[arch]
    assert line["ok"] and line["names_from"] == "vllm", line.get("why")
    assert line["stand_in_calls"] == [], line["stand_in_calls"]
    assert line["unplaced"] == [], f"vLLM's load_weights put these nowhere: {line['unplaced']}"
    assert line["healthy_load"]["ok"], line["healthy_load"]
    assert any(line["declared"].values()), "no module stored NVFP4: the export judges nothing"


def test_vllm_loads_mimo_with_an_mtp_block_doctor_does_not_check(tmp_path, capsys):
    """vLLM 0.32's MiMoForCausalLM drops model.mtp_layers.* unread (mimo.py: hf_to_vllm_mapper orig_to_new_prefix
    {"model.mtp_layers.": None}), the fact the row's renames record: an export whose MTP q_proj is BF16 and excluded
    nowhere loads, with no parameter of the main model named after it; doctor agrees (0 errors, one note)."""
    from tests.conftest import run_captured
    from tests.test_remote_config_rows import mimo_with_mtp
    from tools.real_fixture import write_real_model

    mimo = mimo_with_mtp(write_real_model(tmp_path / "qwen3", "qwen3-32b"), tmp_path / "mimo")
    (line,) = in_vllm("vllm_load.py", mimo)
    assert line["ok"], line
    assert not any("mtp" in name for name in line["params"]), sorted(line["params"])
    code, out, _ = run_captured(capsys, "doctor", mimo, "--target", "vllm==0.32.0")
    assert code == 0 and "0 error(s)" in out.splitlines()[0] and "model.mtp_layers." in out, out


TELECHAT2_KEY_VALUE = """
from vllm_runtime import emit, enable_cpu_nvfp4, kernel_stand_ins, nvfp4_moe_emulation_fallback, torchvision_stand_in, world_of_one
from vllm_profile import built_from, no_triton_allocator
from vllm_profile_configs import model_types, small_config
from vllm_declared import placements
from vllm.config import set_current_vllm_config
enable_cpu_nvfp4(); nvfp4_moe_emulation_fallback(); torchvision_stand_in(); kernel_stand_ins(); no_triton_allocator()
config = small_config("TeleChat2ForCausalLM", model_types())[0]
model, vc = built_from("TeleChat2ForCausalLM", config, True)
h = config["hidden_size"]
for leaf, shape, dtype in [("weight", [2 * h, h // 2], "uint8"), ("weight_scale_2", [], "float32")]:
    name = "transformer.h.0.self_attention.key_value." + leaf
    try:
        with world_of_one(vc), set_current_vllm_config(vc):
            emit({"leaf": leaf, "placed": placements(model, {name: (name, shape, dtype)})[name]["vllm_module"]})
    except Exception as e:
        emit({"leaf": leaf, "error": f"{type(e).__name__}: {e}"})
"""


def test_vllm_splits_telechat2s_key_value_in_code_and_refuses_its_nvfp4_scalar(tmp_path):
    """Why TeleChat2 has no row (its unprofiled reason: telechat2.py's `_split_key_value`, a rename no mapper records):
    TeleChat2 publishes k/v as one `key_value` tensor, which vLLM 0.32 de-interleaves by rows in code before its mapper
    runs. Measured here with vLLM's own load_weights on the learned config: the packed NVFP4 `key_value.weight` is
    placed in qkv_proj, but ModelOpt's 0-d `weight_scale_2` (and `input_scale`) cannot be split by rows, so vLLM 0.32
    loads no NVFP4 TeleChat2 export whose key_value is quantized."""
    import subprocess

    from .probe import REPO, VLLM_PY

    script = tmp_path / "telechat2_key_value.py"
    script.write_text(TELECHAT2_KEY_VALUE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), str(script)], capture_output=True, text=True, timeout=900, cwd="/",
                          env={**env, "PYTHONPATH": str(REPO / "tools")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    weight, scale = (json.loads(line) for line in proc.stdout.splitlines())
    assert weight == {"leaf": "weight", "placed": "model.layers.0.self_attn.qkv_proj"}, weight
    assert scale == {"leaf": "weight_scale_2", "error": "IndexError: too many indices for tensor of dimension 0"}, scale
