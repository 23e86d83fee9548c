"""A row's build for another value of a config field (the profile's `variants`, tools/vllm_variants.py), judged by vLLM
0.32's own loader. DeepSeek-V2-Lite's config sets q_lora_rank null: vLLM builds kv_a_proj_with_mqa as a ReplicatedLinear
of its own (deepseek_v2.py:1051-1065), asked by its own prefix, and no fused_qkv_a_proj. With q_lora_rank set it is a
shard of fused_qkv_a_proj, whose prefix an entry naming the shard is no substring of (modelopt.py:187-222). Each tiny
export is tools/vllm_arch_check.py's (transformers' own names for the profile's small config, --set the field), with
layer 0's kv_a_proj_with_mqa stored BF16 and excluded by `layers.0.self_attn.kv_a_proj_with_mqa` (a substring entry);
doctor --target vllm==0.32.0 must exit 0 exactly where vLLM loads it. DeepseekV3ForCausalLM is V2's class body
(deepseek_v2.py:2005-2006): Moonlight-16B-A3B's config sets q_lora_rank null under it, judged alike.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .probe import requires_vllm
from .test_asked_prefixes_vs_vllm import bf16_excluded, doctor
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

SHARD = "model.layers.0.self_attn.kv_a_proj_with_mqa"
ENTRY = "layers.0.self_attn.kv_a_proj_with_mqa"
BUILDS = {"lite": {"q_lora_rank": None}, "full": {}}  # the profile's small config has q_lora_rank set
ARCHS = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[tuple[str, str], Path]:
    out = {}
    for name in ARCHS:
        for build, fields in BUILDS.items():
            root = tmp_path_factory.mktemp(build)
            (root / "fields.json").write_text(json.dumps(fields))
            [line] = in_vllm("vllm_arch_check.py", root / "out", name, "--set", root / "fields.json")
            assert line["ok"] and line["healthy_load"]["ok"] and not line["stand_in_calls"], line
            out[name, build] = Path(line["healthy"])
    return out


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("build, loads", [("lite", True), ("full", False)])
def test_kv_a_proj_excluded_by_its_own_name_loads_only_where_vllm_builds_it_alone(capsys, exports, tmp_path, name, build,
                                                                                  loads):
    config = json.loads((exports[name, build] / "config.json").read_text())
    assert (config.get("q_lora_rank") is None) is loads, config.get("q_lora_rank")
    folder = bf16_excluded(exports[name, build], tmp_path / build, (SHARD,), [ENTRY])
    [loaded] = in_vllm("vllm_load.py", folder, "--moe-emulation")  # layer 1's NVFP4 experts on this CPU host
    assert loaded["ok"] is loads and (loads or loaded["error_type"] == "AssertionError"), loaded  # the shard's shape
    code, out = doctor(capsys, folder)
    assert (code == 0) is loads, out
    if not loads:
        assert "[fused-shards] model.layers.0.self_attn.fused_qkv_a_proj:" in out and f"{SHARD} is stored bf16" in out, out


@pytest.mark.parametrize("name", ARCHS)
@pytest.mark.parametrize("build", sorted(BUILDS))
def test_fix_keeps_its_promise_on_either_build(capsys, exports, tmp_path, name, build):
    """fix --target vllm==0.32.0: nothing to fix where vLLM loads it (Lite); where it does not (the fused build), a copy
    vLLM loads (every shard of fused_qkv_a_proj written alike) or a one-line refusal."""
    from tests.conftest import run_captured

    folder = bf16_excluded(exports[name, build], tmp_path / build, (SHARD,), [ENTRY])
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", "vllm==0.32.0")
    if build == "lite":
        assert code == 0 and "nothing to fix" in out + err and not (tmp_path / "out").exists(), out + err
        return
    assert code in (0, 2), out + err
    if code == 2:
        assert err.count("\n") == 1 and not (tmp_path / "out").exists(), err
        return
    [loaded] = in_vllm("vllm_load.py", tmp_path / "out", "--moe-emulation")
    assert loaded["ok"], loaded
