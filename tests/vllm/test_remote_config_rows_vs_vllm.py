"""The vLLM 0.32 rows learned from vLLM's own model code (config class with remote code only: tools/vllm_remote_configs.py)
are judged by vLLM 0.32's own loader: for each, tools/vllm_arch_check.py writes a tiny ModelOpt NVFP4 export of the
learned config under exactly the names the row was learned from (vLLM's own, fused layers as their shards, routed
experts per expert: tools/vllm_saved_names.py own_checkpoint), and vLLM's load_weights places every one of them
(none rejected or skipped) and its loader fills every parameter (weights tracked). doctor and fix, on these exports and
their broken copies, are judged by tests/vllm/test_generated_archs_vs_vllm.py, which takes every shipped row (a broken
copy may load: Exaone's layers are asked under `model.` while its checkpoint names are `transformer.`, so an exclusion
of the checkpoint name reaches nothing, and doctor must say so from the row's `prefixes`).
"""

from __future__ import annotations

import json

import pytest

from .probe import requires_vllm
from .test_profiles_vs_vllm import SHIPPED, in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

ROWS = json.loads(SHIPPED.read_text())["architectures"]
LEARNED = sorted(a for a, e in ROWS.items() if e["config"]["source"].startswith("learned from vLLM's model code"))


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
