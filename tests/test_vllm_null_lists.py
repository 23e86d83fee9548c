"""A null exclusion list where vLLM's ModelOpt reader takes one is vLLM's config-time error too, not only SGLang's.

vLLM's ModelOptNvFp4Config.from_config (modelopt.py, 0.28-0.32) reads config.json's flat `ignore`, or the nested
`quantization.exclude_modules` (hf_quant_config.json, or a config.json block holding `quantization`), and raises
"exclude_modules must be a list" on null. The profile records the error from vLLM's own call
(tools/vllm_null_lists.py); doctor said such a checkpoint is healthy for vLLM.
"""

from __future__ import annotations

import pytest

from tests.conftest import run_captured
from tests.test_runtime_sglang import doctor, null_list_layout

VLLM_NULL = "ValueError: exclude_modules must be a list, got <class 'NoneType'>"
READ_BY_VLLM = {"flat-ignore": True, "hf-exclude_modules": True,  # the list vLLM reads
                "nested-top-ignore": False, "nested-top-modules_to_not_convert": False}  # SGLang's list, not vLLM's


@pytest.mark.parametrize("name", sorted(READ_BY_VLLM))
@pytest.mark.parametrize("release", ["0.28.0", "0.32.0"])
def test_a_null_list_vllm_reads_is_its_config_error(capsys, tmp_path, name, release):
    folder = null_list_layout(tmp_path, name)
    target = f"vllm=={release}"
    code, report = doctor(capsys, folder, target)
    found = [f for f in report["findings"] if f["runtime_error"] == VLLM_NULL]
    if not READ_BY_VLLM[name]:
        assert not found, found
        return
    assert code == 1 and len(found) == 1 and found[0]["severity"] == "error", report["findings"]
    assert [s["error"] for s in report["runtime_stops_at"]] == [VLLM_NULL], report["runtime_stops_at"]


@pytest.mark.parametrize("name", ["flat-ignore", "hf-exclude_modules"])
def test_fix_for_vllm_and_sglang_writes_a_list_both_read(capsys, tmp_path, name):
    folder = null_list_layout(tmp_path, name)
    targets = "vllm==0.28.0,vllm==0.32.0,sglang==0.5.23"  # trtllm: the GLM layout lacks its MTP layer
    code, _, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", targets, "--quiet")
    assert code == 0, err
    for target in targets.split(","):
        assert run_captured(capsys, "doctor", tmp_path / "out", "--target", target, "--strict")[0] == 0, target
