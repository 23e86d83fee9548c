"""Attacks on the 2:4 sparsity reading (doctor/sparse_24.py) and its neighbours, each checked against the runtime's code.

SGLang 0.5.23's own `supports_cutlass_24` (compressed_tensors.py:1240-1242, "Weight only quantization is not-supported")
returns False for FP8 per-tensor weights without input_activations, so such a Linear is built by its scheme, not refused
for its sparsity; repair read every `float-quantized` 8-bit per-tensor group as the W8A8 preset ("FP8"), so doctor named
it refused by the sparsity config and missing an input_scale it never needs. vLLM 0.28/0.30/0.32 refuse any
`sparsity_config` with targets while reading the config (compressed_tensors.py `_parse_sparsity_config`: raise
DeprecationWarning "Sparsity support has been removed from compressed-tensors"), which no release file records yet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_captured


def fp8_attention(root: Path, inputs: dict | None) -> Path:
    """Qwen3 (dense) in compressed-tensors mixed-precision: attention FP8 per-tensor weights (with `inputs` as its
    input_activations), MLP NVFP4 W4A4, a 2:4 sparsity config over the attention."""
    import torch
    from safetensors.torch import load_file

    from tests.ct_group_cases import NVFP4, _group
    from tests.test_ct_groups_sglang_releases import rewrite
    from tests.test_moe_scheme_refused import dense_weight_only

    out = dense_weight_only(root)
    tensors = load_file(out / "model.safetensors")
    for module in sorted({k.rsplit(".", 1)[0] for k in tensors if ".self_attn." in k and k.endswith(".weight_packed")}):
        rows, half = tensors[module + ".weight_packed"].shape
        for name in [k for k in tensors if k.startswith(module + ".")]:
            del tensors[name]
        tensors[module + ".weight"] = (torch.randn(rows, 2 * half) * 0.05).to(torch.float8_e4m3fn)
        tensors[module + ".weight_scale"] = torch.tensor([0.01])
        if inputs:
            tensors[module + ".input_scale"] = torch.tensor([0.01])
    for module in sorted({k.rsplit(".", 1)[0] for k in tensors if ".mlp." in k and k.endswith(".weight_packed")}):
        tensors[module + ".input_global_scale"] = torch.tensor(100.0)
    rewrite(out, tensors)
    config = json.loads((out / "config.json").read_text())
    fp8 = {"format": "float-quantized", "targets": ["re:.*self_attn.*"], "input_activations": inputs,
           "weights": {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}}
    config["quantization_config"].update(format="mixed-precision", config_groups={
        "group_0": fp8, "group_1": _group(NVFP4, "re:.*mlp.*")}, sparsity_config={
        "format": "dense", "sparsity_structure": "2:4", "targets": ["re:.*self_attn.*"], "ignore": []})
    (out / "config.json").write_text(json.dumps(config))
    return out


STATIC = {"num_bits": 8, "type": "float", "strategy": "tensor", "symmetric": True, "dynamic": False}


def test_a_weight_only_fp8_group_is_not_read_as_the_w8a8_scheme_sglang_refuses_under_2_4(capsys, tmp_path):
    src = fp8_attention(tmp_path, None)
    code, out, err = run_captured(capsys, "doctor", src, "--target", "sglang==0.5.23")
    assert "CompressedTensors24" not in out + err and "input_scale" not in out + err, out
    assert code == 2 and err.count("\n") == 1 and "input_activations" in err, err


def test_the_w8a8_fp8_group_under_2_4_is_still_refused(capsys, tmp_path):
    code, out, _ = run_captured(capsys, "doctor", fp8_attention(tmp_path, STATIC), "--target", "sglang==0.5.23")
    assert code == 1 and "ImportError: CompressedTensors24 is not supported now" in out, out


@pytest.mark.parametrize("target", ["vllm==0.28.0", "vllm==0.30.0", "vllm==0.32.0"])
@pytest.mark.parametrize("structure, fmt", [("unstructured", "dense"), ("2:4", "sparse-24-bitmask")])
def test_vllm_refuses_any_sparsity_config_with_targets(capsys, tmp_path, target, structure, fmt):
    """vLLM 0.28/0.30/0.32 raise DeprecationWarning('Sparsity support has been removed from compressed-tensors...') in
    CompressedTensorsConfig._parse_sparsity_config for any sparsity_config with targets (0.32 compressed_tensors.py:
    286-300), while reading the config: the release's `ct_sparsity_refused` (tools/vllm_ct_sparsity.py)."""
    from tests.test_sparse24_sglang import SPARSE, sparse_qwen3

    folder = sparse_qwen3(tmp_path, {**SPARSE, "sparsity_structure": structure, "format": fmt})
    code, out, _ = run_captured(capsys, "doctor", folder, "--target", target)
    assert code == 1 and "Sparsity support has been removed" in out and "0 error" not in out, out
    assert ("remove it from config.json" in out) is (fmt == "dense"), out
    code, out, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--target", target)
    assert code == 2 and len(err.strip().splitlines()) == 1 and not (tmp_path / "out").exists(), out + err


def test_vllm_reads_a_sparsity_config_whose_targets_are_empty(capsys, tmp_path):
    """An empty targets list builds an empty sparse scheme map, which the same method returns without raising."""
    from tests.test_sparse24_sglang import SPARSE, sparse_qwen3

    code, out, _ = run_captured(capsys, "doctor", sparse_qwen3(tmp_path, {**SPARSE, "targets": []}), "--target", "vllm==0.32.0")
    assert "Sparsity support" not in out, out


@pytest.mark.parametrize("value", [{"sparsity_structure": "2:4", "targets": ["Linear"]},
                                   {"format": ["dense"], "sparsity_structure": "2:4", "targets": ["Linear"]},
                                   {"format": "dense", "sparsity_structure": 24, "targets": ["Linear"]}])
def test_a_sparsity_config_the_runtimes_config_class_refuses_is_refused_in_one_line(capsys, tmp_path, value):
    """SGLang (0.5.23 compressed_tensors.py:334) and vLLM validate it as compressed-tensors' SparsityCompressionConfig,
    whose `format` is a required string and `sparsity_structure` an optional one (pydantic's ValidationError otherwise,
    measured with the SGLang venv's compressed-tensors); doctor had said nothing (exit 0)."""
    from tests.test_sparse24_sglang import sparse_qwen3

    code, _, err = run_captured(capsys, "doctor", sparse_qwen3(tmp_path, value), "--target", "sglang==0.5.23")
    assert code == 2 and err.count("\n") == 1 and "sparsity_config" in err, err


@pytest.mark.parametrize("value", [[], False, "", 0])
def test_a_falsy_sparsity_config_is_none_as_the_runtimes_read_it(capsys, tmp_path, value):
    """`if not (sparsity_config := config.get("sparsity_config"))` (SGLang 0.5.23 compressed_tensors.py:331, vLLM alike):
    any falsy value is no sparsity config, so the model is built as without one; doctor had refused it (exit 2)."""
    from tests.test_sparse24_sglang import sparse_qwen3

    code, out, err = run_captured(capsys, "doctor", sparse_qwen3(tmp_path, value), "--target", "sglang==0.5.23")
    assert code == 0 and not err, (out, err)


def test_a_class_name_regex_sparsity_target_covers_the_layers_it_names(capsys, tmp_path):
    """find_matched_target's class pass re.match'es a `re:` target on the module's class name (SGLang 0.5.23
    compressed_tensors/utils.py:139, 180-183), so `re:.*Linear$` makes every Linear sparse, the ignored BF16 down_proj
    too, which 0.5.23 refuses; doctor had read `re:` targets against names only and said nothing (exit 0)."""
    from tests.test_sparse24_sglang import IGNORED, SPARSE, sparse_qwen3

    src = sparse_qwen3(tmp_path, {**SPARSE, "targets": ["re:.*Linear$"]})
    code, out, _ = run_captured(capsys, "doctor", src, "--target", "sglang==0.5.23")
    assert code == 1 and "ImportError: CompressedTensors24 is not supported now" in out and IGNORED in out, out


def test_a_sparsity_config_of_twenty_thousand_patterns_is_read_in_seconds(capsys, tmp_path):
    """Any target matching makes a layer sparse (all map to the one sparsity config), so the targets are one compiled
    set, not the first-match tree of the config groups (n log n patterns: 20000 took 47 s and 1.8 GB before)."""
    import time

    from tests.test_sparse24_sglang import SPARSE, sparse_qwen3

    targets = [f"re:model\\.layers\\.{i}\\.x.*" for i in range(20000)] + ["re:.*down_proj$"]
    src = sparse_qwen3(tmp_path, {**SPARSE, "targets": targets, "ignore": [f"n{i}" for i in range(20000)]})
    start = time.monotonic()
    code, out, _ = run_captured(capsys, "doctor", src, "--target", "sglang==0.5.23")
    assert code == 1 and "CompressedTensors24" in out and time.monotonic() - start < 15, time.monotonic() - start
