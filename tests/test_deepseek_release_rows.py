"""DeepSeek-V3/R1 NVFP4 layouts read with each vLLM release's own generated row, never the generic one.

vLLM 0.28's profile left DeepseekV3ForCausalLM unprofiled (its CPU build imports a FlashAttention name fa_utils.py
defines only on CUDA; tools/vllm_gpu_stand_ins.py `fa_utils_none_stand_in`), so doctor checked R1's published layout
with generic roles and said nothing, though 0.28 builds q_a_proj and kv_a_proj_with_mqa as one fused_qkv_a_proj
(models/deepseek_v2.py) and R1's config excludes only kv_a_proj_with_mqa: vLLM refuses it while building, as 0.30
and 0.32 do. Fixtures: tools/real_fixture.py (published configs and names, tiny sizes).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.real_fixture import write_real_model

from tests.conftest import run_captured

RELEASES = ("vllm==0.28.0", "vllm==0.30.0", "vllm==0.32.0")


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("deepseek")
    return {key: write_real_model(root / key, key) for key in ("deepseek-v3-0324", "deepseek-r1")}


def doctor(capsys, folder: Path, target: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", "--target", target, "--strict", "--json", folder)
    assert code in (0, 1) and "Traceback" not in err, err
    return code, json.loads(out)


@pytest.mark.parametrize("target", RELEASES)
def test_v3_0324_layout_is_checked_with_the_releases_own_row_and_is_healthy(layouts, capsys, target):
    code, report = doctor(capsys, layouts["deepseek-v3-0324"], target)
    release = target.replace("==", " ")
    assert f"its layer roles and fused layers are {release}'s own (generated profile)" in report["checked"], report["checked"]
    assert (code, report["findings"]) == (0, []), report["findings"]


@pytest.mark.parametrize("target", RELEASES)
def test_r1_layout_split_fused_qkv_a_proj_stops_every_release(layouts, capsys, target):
    """R1 (ModelOpt 0.23) excludes kv_a_proj_with_mqa by exact name but not q_a_proj: every profiled release builds the
    two as one layer and refuses shards of mixed precision while building (the generic row saw two layers)."""
    code, report = doctor(capsys, layouts["deepseek-r1"], target)
    assert "does not cover" not in report["checked"], report["checked"]
    split = {f["subject"] for f in report["findings"] if f["code"] == "fused-shards" and f["severity"] == "error"}
    assert code == 1 and {f"model.layers.{i}.self_attn.fused_qkv_a_proj" for i in range(61)} <= split, report["findings"]
    assert report["runtime_stops_at"], report
