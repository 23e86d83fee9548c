"""A compressed-tensors config with a 2:4 `sparsity_config` under SGLang: every release 0.5.9-0.5.23 raises
`ImportError: CompressedTensors24 is not supported now` in `get_linear_scheme` (0.5.23 compressed_tensors.py:1057-1062)
for a Linear its sparsity targets match where its own `supports_cutlass_24` holds: an unquantized layer (one the
quantization config ignores) or an 8-bit FP8 per-tensor one; never for NVFP4 (4-bit; tensor_group strategy) nor FP8
block. tools/sglang_sparse24.py compiles that function from each wheel and asks it (`sparse_24_refused`); doctor names
the first such Linear the build meets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.targets.runtime_rules import shipped_rules
from tests.conftest import run_captured

ERROR = "ImportError: CompressedTensors24 is not supported now"
IGNORED = "model.layers.0.mlp.down_proj"


def sparse_qwen3(root: Path, sparsity: dict | None) -> Path:
    """Qwen3 (dense, the real layout) in compressed-tensors NVFP4 (W4A4), layer 0's down_proj ignored and stored BF16,
    the config's `sparsity_config` as given."""
    import torch
    from safetensors.torch import load_file

    from tests.test_ct_groups_sglang_releases import rewrite
    from tests.test_moe_scheme_refused import dense_weight_only

    out = dense_weight_only(root)
    tensors = load_file(out / "model.safetensors")
    rows, half = tensors[IGNORED + ".weight_packed"].shape
    for name in [k for k in tensors if k.startswith(IGNORED + ".")]:
        del tensors[name]
    tensors[IGNORED + ".weight"] = (torch.randn(rows, 2 * half) * 0.05).to(torch.bfloat16)
    for name in [k for k in tensors if k.endswith(".weight_packed")]:
        tensors[name.replace(".weight_packed", ".input_global_scale")] = torch.tensor(100.0)
    rewrite(out, tensors)
    config = json.loads((out / "config.json").read_text())
    qc = config["quantization_config"]
    for group in qc["config_groups"].values():  # W4A4 again, as the converter wrote it before weight_only
        group["input_activations"] = {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
                                      "dynamic": "local", "symmetric": True}
    qc["ignore"] = [*qc.get("ignore", []), IGNORED]
    qc["sparsity_config"] = sparsity
    (out / "config.json").write_text(json.dumps(config))
    return out


SPARSE = {"format": "dense", "sparsity_structure": "2:4", "targets": ["Linear"], "ignore": ["lm_head"],
          "global_sparsity": 0.5, "registry_requires_subclass": False}


def doctor(capsys, src: Path, target: str) -> tuple[int, dict]:
    code, out, _ = run_captured(capsys, "doctor", src, "--target", target, "--json")
    return code, json.loads(out)


@pytest.fixture(scope="module")
def sparse(tmp_path_factory) -> Path:
    return sparse_qwen3(tmp_path_factory.mktemp("sparse"), SPARSE)


@pytest.mark.parametrize("target", ["sglang==0.5.9", "sglang==0.5.12", "sglang==0.5.23"])
def test_an_ignored_linear_a_2_4_sparsity_config_targets_stops_the_build(capsys, sparse, target):
    code, doc = doctor(capsys, sparse, target)
    refused = [f for f in doc["findings"] if f["runtime_error"] == ERROR]
    assert code == 1 and [f["subject"] for f in refused] == [IGNORED], doc["findings"]
    assert "supports_cutlass_24" in refused[0]["message"] and "2:4" in refused[0]["message"], refused


@pytest.mark.parametrize("sparsity", [None, {}, {**SPARSE, "targets": ["re:.*self_attn.*"]},
                                      {**SPARSE, "sparsity_structure": "unstructured"}])
def test_no_sparsity_or_one_that_targets_no_refused_layer_is_built(capsys, tmp_path, sparsity):
    code, doc = doctor(capsys, sparse_qwen3(tmp_path, sparsity), "sglang==0.5.23")
    assert code == 0 and not doc["findings"], doc["findings"]


@pytest.mark.parametrize("value", [[1], "Linear", {"targets": "Linear", "sparsity_structure": "2:4", "format": "dense"},
                                   {"targets": ["re:("], "sparsity_structure": "2:4", "format": "dense"}])
def test_a_broken_sparsity_config_is_refused_in_one_line(capsys, tmp_path, value):
    src = sparse_qwen3(tmp_path, value)
    code, _, err = run_captured(capsys, "doctor", src, "--target", "sglang==0.5.23")
    assert code == 2 and err.count("\n") == 1 and "sparsity_config" in err, err


def test_every_release_records_the_schemes_its_check_holds_for():
    for rules in shipped_rules():
        if rules.runtime == "sglang":
            fact = rules.sparse_24_refused["compressed-tensors"]
            assert fact["error"] == ERROR and fact["refused"] == {"dense": ["BF16", "FP8"], "sparse-24-bitmask": ["BF16", "FP8"]}


def test_the_shipped_block_is_what_the_tool_reads_from_each_wheel():
    """Where the wheels are at hand (pip download --no-deps sglang==X): a release's own file holds what the tool reads
    from its wheel; a release falling back to a file refuses the same schemes (at its own line)."""
    import glob

    from tools.sglang_sparse24 import read_wheel

    facts = {r.release: r.sparse_24_refused for r in shipped_rules() if r.runtime == "sglang"}
    read = {tuple(map(int, Path(p).name.split("-")[1].split("."))): read_wheel(Path(p))[2]
            for p in glob.glob("/tmp/sgl*/*/sglang-*.whl")}
    if not read:
        pytest.skip("no SGLang wheel downloaded")
    for version, block in read.items():
        own = facts.get(version) or facts[max(v for v in facts if v <= version)]
        assert block == own if version in facts else block["compressed-tensors"]["refused"] == own["compressed-tensors"]["refused"]
