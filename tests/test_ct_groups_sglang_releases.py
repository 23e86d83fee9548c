"""compressed-tensors config groups of different schemes under each shipped SGLang release, as its own code reads them.

Two per-release facts, both generated from each wheel:
  * the order find_matched_target tries a config-group target in (compressed_tensors/utils.py, 0.5.9:122-126 as in
    0.5.23: name, class name, fused shards; vLLM 0.32: name, fused, class), `ct_target_order` in every release file;
  * what the release builds of a group in a config whose top-level `format` is `mixed-precision` (what
    compressed-tensors writes when the groups' formats differ, each group carrying its own). 0.5.9-0.5.16 read only the
    top-level format (`_quantization_scheme_map_from_config`, 0.5.12 compressed_tensors.py:307: the group's input
    activations are dropped unless `is_activation_quantization_format(quant_format)`; `_get_scheme_from_parts` gates on
    `self.quant_format` too, :564), so every quantized Linear reaches the final NotImplementedError; 0.5.17+ read the
    group's own format (0.5.23 compressed_tensors.py:379, 753) and build it. tools/sglang_linear_schemes.py asks each
    wheel's own predicates so (`<algorithm> in mixed-precision`); doctor names the first Linear the build meets.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from repair.targets.runtime_rules import shipped_rules
from tests.conftest import run_captured
from tests.ct_group_cases import FP8, LLAMA_PACKED, NVFP4, ORDER_CASE, _group, declaration_for

OLD = ("sglang==0.5.9", "sglang==0.5.10", "sglang==0.5.11", "sglang==0.5.12")
REFUSED = "NotImplementedError: No compressed-tensors compatible scheme was found."


@pytest.mark.parametrize("target", [*OLD, "sglang==0.5.23"])
def test_every_sglang_release_tries_a_class_name_target_before_fused_shards(tmp_path, target):
    _, prefix, expected = ORDER_CASE
    declaration, _ = declaration_for(tmp_path, "order", target)
    packed = {k: tuple(v) for k, v in LLAMA_PACKED.items()}
    assert declaration.algorithm(prefix, packed) == expected["sglang"]


def test_each_release_file_records_its_find_matched_target_order():
    orders = {r.label: r.ct_target_order for r in shipped_rules() if r.runtime == "sglang"}
    assert set(orders.values()) == {("name", "class", "fused")}, orders


def mixed_qwen3(root: Path) -> Path:
    """Qwen3 (dense, the real layout) as compressed-tensors writes groups of two formats: attention FP8 block 128x128
    (group_0 of RedHatAI's real DeepSeek-V4-Flash config), MLP NVFP4 W4A4 (its group_1), top-level `mixed-precision`."""
    from tests.test_moe_scheme_refused import dense_weight_only

    return mixed_groups(dense_weight_only(root))


def mixed_groups(out: Path) -> Path:
    """A compressed-tensors NVFP4 checkpoint rewritten so: attention FP8 block, MLP NVFP4 W4A4, `mixed-precision`."""
    import torch
    from safetensors.torch import load_file

    from tools.dsv4_fixture import _fp8_block

    tensors = load_file(out / "model.safetensors")
    gen = torch.Generator().manual_seed(0)
    for module in sorted({k.rsplit(".", 1)[0] for k in tensors if ".self_attn." in k and k.endswith(".weight_packed")}):
        rows, half = tensors[module + ".weight_packed"].shape
        for name in [k for k in tensors if k.startswith(module + ".")]:
            del tensors[name]
        tensors |= _fp8_block(module, rows, 2 * half, gen)
    for module in sorted({k.rsplit(".", 1)[0] for k in tensors if ".mlp." in k and k.endswith(".weight_packed")}):
        tensors[module + ".input_global_scale"] = torch.tensor(100.0)
    rewrite(out, tensors)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"].update(format="mixed-precision", config_groups={
        "group_0": _group(FP8, "re:.*self_attn.*"), "group_1": _group(NVFP4, "re:.*mlp.*")})
    (out / "config.json").write_text(json.dumps(config))
    return out


def rewrite(out: Path, tensors: dict) -> None:
    """The one-file checkpoint's tensors replaced (its index, where there is one, listing them)."""
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    index = out / "model.safetensors.index.json"
    if index.exists():
        doc = json.loads(index.read_text())
        doc["weight_map"] = {k: "model.safetensors" for k in tensors}
        index.write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return mixed_qwen3(tmp_path_factory.mktemp("mixed"))


def doctor(capsys, src: Path, target: str) -> tuple[int, dict]:
    code, out, _ = run_captured(capsys, "doctor", src, "--target", target, "--json")
    return code, json.loads(out)


@pytest.mark.parametrize("target", OLD)
def test_sglang_up_to_0_5_16_refuses_a_mixed_precision_config_at_its_first_linear(capsys, mixed, target):
    code, doc = doctor(capsys, mixed, target)
    refused = [f for f in doc["findings"] if f["runtime_error"] == REFUSED]
    assert code == 1 and [f["subject"] for f in refused] == ["model.layers.0.self_attn.qkv_proj"], doc["findings"]
    assert "mixed-precision" in refused[0]["message"] and "_get_scheme_from_parts" in refused[0]["message"], refused


def test_sglang_0_5_23_builds_each_group_as_its_own_format(capsys, mixed):
    code, doc = doctor(capsys, mixed, "sglang==0.5.23")
    assert code == 0 and not doc["findings"], doc["findings"]
    assert doc["schemes"]["model.layers.0.self_attn.q_proj"] == "fp8_block", doc["schemes"]
    assert doc["schemes"]["model.layers.0.mlp.down_proj"] == "nvfp4", doc["schemes"]


def test_each_release_records_whether_it_reads_the_groups_own_format():
    """0.5.9-0.5.16 read the top-level format only, 0.5.17+ the group's (tools/sglang_linear_schemes.py on each wheel):
    each release's own file says so (before, 0.5.13-0.5.22 fell back to 0.5.12's, whose built_by named 0.5.17-0.5.22)."""
    blocks = {r.label: r.linear_scheme_refused for r in shipped_rules() if r.runtime == "sglang"}
    for n in range(9, 24):
        block = blocks[f"sglang 0.5.{n}"].get("compressed-tensors", {})
        for algo in ("FP8_BLOCK", "NVFP4"):
            fact = block.get(f"{algo} in mixed-precision")
            assert (fact is not None) == (n <= 16) and (fact is None or fact["error"] == REFUSED and "built_by" not in fact), (n, fact)


@pytest.mark.parametrize("release,refused", [("0.5.16", True), ("0.5.17", False)])
def test_0_5_16_and_0_5_17_judge_a_mixed_precision_config_each_by_its_own_reading(capsys, mixed, release, refused):
    code, doc = doctor(capsys, mixed, f"sglang=={release}")
    assert (code == 1) == refused and bool(doc["findings"]) == refused, (release, doc["findings"])
    if refused:
        assert any(f["runtime_error"] == REFUSED for f in doc["findings"]), doc["findings"]


def test_the_order_is_read_from_the_wheels_find_matched_target_and_another_shape_stops_the_tool():
    import ast

    from tools.sglang_rules_data import target_order

    def utils(expr: str) -> ast.Module:
        return ast.parse(f"def find_matched_target(layer_name, module, targets, fused_mapping):\n    matched_target = {expr}\n")

    name, cls, fused = ("_find_first_match(layer_name, targets)", "_find_first_match(module.__class__.__name__, targets, True)",
                        "_match_fused_layer(layer_name, targets, fused_mapping)")
    assert target_order(utils(f"{name} or {fused} or {cls}")) == ["name", "fused", "class"]
    assert target_order(utils(f"{name} or {cls} or {fused}")) == ["name", "class", "fused"]
    for other in (f"{name} or _find_first_match(layer_name, targets, True)", name):
        with pytest.raises(SystemExit, match="read it anew"):
            target_order(utils(other))


def test_older_sglang_names_the_experts_of_a_mixed_precision_moe_too(capsys, tmp_path):
    """get_moe_scheme has no format gate, but the scheme map 0.5.9-0.5.16 build stores the NVFP4 group without its
    input activations, and their chain's `_is_dynamic_token_w8a8` reads that None (tools/sglang_moe_schemes.py on each
    wheel); 0.5.17+ keep the group's inputs and build CompressedTensorsW4A4Nvfp4MoE."""
    from tests.test_expert_scales import MOE, compressed_tensors_moe

    src = mixed_groups(compressed_tensors_moe(tmp_path, broken=()))
    code, doc = doctor(capsys, src, "sglang==0.5.12")
    subjects = {f["subject"]: f["runtime_error"] for f in doc["findings"]}
    experts = MOE.rpartition(".")[0] + ".experts"  # the fixture stores the MoE layers only (no attention)
    assert code == 1 and subjects == {experts: "AttributeError: 'NoneType' object has no attribute 'num_bits'"}, doc["findings"]
    assert "NVFP4 in mixed-precision" in doc["findings"][0]["message"], doc["findings"]
    code, doc = doctor(capsys, src, "sglang==0.5.23")
    assert code == 0 and not doc["findings"], doc["findings"]


def test_fix_for_an_older_release_refuses_in_one_line_and_writes_nothing(capsys, mixed, tmp_path):
    code, _, err = run_captured(capsys, "fix", mixed, "-o", tmp_path / "out", "--target", "sglang==0.5.12", "--quiet")
    assert code == 2 and err.count("\n") == 1 and "mixed-precision" in err and not (tmp_path / "out").exists(), err
