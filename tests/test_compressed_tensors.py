"""The compressed-tensors `nvfp4-pack-quantized` format, on a fixture made by compressed-tensors' own converter.

The converter keeps the ModelOpt export's bug (pre/post_projection packed, `ignore: [lm_head]`),
so the same repair applies; its dequantized values must equal the ModelOpt path's.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from compressed_tensors.utils.match import match_name

from repair.arch.gemma4_assistant import draft_prefix
from repair.formats.compressed_tensors import ct_entry_matches
from tests.conftest import load_tensors, raw_bytes, read_json, run_captured, tree_hashes

HANDSHAKE = ("pre_projection", "post_projection")
CT_LEAVES = ("weight_packed", "weight_scale", "weight_global_scale", "input_global_scale")
ENTRIES = ["lm_head", "re:(.*\\.)?post_projection$", "re:(.*\\.)?pre_projection$"]


def test_the_fixture_is_compressed_tensors_nvfp4(ct_export):
    config = read_json(ct_export / "config.json")["quantization_config"]
    assert (config["quant_method"], config["format"]) == ("compressed-tensors", "nvfp4-pack-quantized")
    names = set(load_tensors(ct_export))
    assert {f"pre_projection.{leaf}" for leaf in CT_LEAVES} <= names and "pre_projection.weight" not in names


def test_inspect_reads_the_layout(capsys, ct_export):
    code, out, _ = run_captured(capsys, "inspect", ct_export, "--json")
    assert code == 0
    report = json.loads(out)
    assert report["format"] == "compressed-tensors"
    modules = {m["name"]: m for m in report["modules"]}
    pre = modules["pre_projection"]
    assert (pre["precision"], pre["stored_shape"], pre["logical_shape"], pre["expected_shape"]) == ("nvfp4", [64, 96], [64, 192], [64, 192])
    assert pre["declared"] == "quantized"
    assert sorted(pre["tensors"]) == sorted(f"pre_projection.{leaf}" for leaf in CT_LEAVES)
    code, text, _ = run_captured(capsys, "inspect", ct_export)
    assert "format: compressed-tensors; declared: NVFP4; excluded: lm_head" in text


def test_doctor_predicts_vllm_by_release(capsys, ct_export):
    code, out, _ = run_captured(capsys, "doctor", ct_export, "--json")
    findings = json.loads(out)["findings"]
    assert code == 0 and sorted((f["code"], f["subject"]) for f in findings) == [("handshake-quantized", m) for m in sorted(HANDSHAKE)]
    code, out, _ = run_captured(capsys, "doctor", ct_export, "--target", "vllm==0.24.0", "--json")
    findings = {f["subject"]: f for f in json.loads(out)["findings"]}
    assert code == 1 and findings["pre_projection"]["code"] == "silent-garbage"
    assert "skips pre_projection.weight_packed as an unknown name, so the layer's weight is never loaded" in findings["pre_projection"]["message"]


def test_fix_dequantizes_and_writes_compressed_tensors_ignore_patterns(capsys, ct_export, tmp_path):
    before = tree_hashes(ct_export)
    out = tmp_path / "fixed"
    code, _, err = run_captured(capsys, "fix", ct_export, "-o", out, "--quiet")
    assert code == 0, err
    assert tree_hashes(ct_export) == before, "the input was modified"
    config = read_json(out / "config.json")["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["ignore"] == ENTRIES
    assert (out / "hf_quant_config.json").read_bytes() == (ct_export / "hf_quant_config.json").read_bytes()
    src, got = load_tensors(ct_export), load_tensors(out)
    for name in HANDSHAKE:
        assert got[f"{name}.weight"].dtype == torch.bfloat16
        assert not [k for k in got if k.startswith(f"{name}.") and k != f"{name}.weight"], "compressed-tensors tensors left behind"
    untouched = [k for k in src if not k.startswith(HANDSHAKE)]
    assert len(untouched) > 30 and all(raw_bytes(got[k]) == raw_bytes(src[k]) for k in untouched)
    code, _, _ = run_captured(capsys, "doctor", out, "--strict")
    assert code == 0


@pytest.mark.parametrize("vllm_name", ["draft_model.pre_projection", "draft_model.post_projection"])
def test_written_patterns_match_vllm_and_compressed_tensors_names(ct_export, tmp_path, capsys, vllm_name):
    """vLLM matches `draft_model.` prefixes by re.match; compressed-tensors' own matcher sees the checkpoint's names."""
    out = tmp_path / "fixed"
    assert run_captured(capsys, "fix", ct_export, "-o", out, "--quiet")[0] == 0
    ignore = read_json(out / "config.json")["quantization_config"]["ignore"]
    module = vllm_name.split(".", 1)[1]
    assert any(ct_entry_matches(vllm_name, e) for e in ignore)
    assert any(match_name(module, e) for e in ignore)  # compressed-tensors' matcher, on transformers' module name
    others = ["draft_model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj", "draft_model.xpre_projection"]
    assert not any(ct_entry_matches(n, e) for n in others for e in ignore if e.startswith("re:"))


def test_a_plain_name_does_not_exclude_under_compressed_tensors_rules(capsys, ct_export, tmp_path):
    """`pre_projection` excludes under ModelOpt's substring rule but not compressed-tensors' exact/regex one."""
    out = tmp_path / "fixed"
    assert run_captured(capsys, "fix", ct_export, "-o", out, "--quiet")[0] == 0
    config = read_json(out / "config.json")
    config["quantization_config"]["ignore"] = ["lm_head", *HANDSHAKE]
    (out / "config.json").write_text(json.dumps(config))
    code, text, _ = run_captured(capsys, "doctor", out, "--json")
    found = json.loads(text)["findings"]
    findings = {f["subject"]: f for f in found if f["code"] == "load-error"}
    assert code == 1
    assert findings["pre_projection"]["runtime_error"].startswith(
        "ValueError: There is no module or parameter named 'model.pre_projection.weight' in Gemma4MTP.")
    assert "'model.pre_projection.weight_packed'" in findings["pre_projection"]["runtime_error"]
    assert "load-error" in {f["code"] for f in found} and "unused-exclusion" not in {f["code"] for f in found}
    # vLLM reads no module by that name; another runtime does (TensorRT-LLM's loader asks `pre_projection` itself,
    # SGLang's compressed-tensors rule before 0.5.23 a substring): a note naming that release, not a warning
    notes = {n["subject"]: n for n in json.loads(text)["notes"] if n["code"] == "unused-exclusion"}
    said = notes["pre_projection"]["message"]
    assert said.startswith("exclusion 'pre_projection' names no module as vllm==0.32.0 reads it; ") and "vllm" not in said.split("; ")[1]
    assert not ct_entry_matches(draft_prefix("pre_projection"), "pre_projection")


def _modelopt_fix(broken_export, out, capsys, *extra):
    assert run_captured(capsys, "fix", broken_export, "-o", out, "--quiet", *extra)[0] == 0
    return load_tensors(out)


@pytest.mark.parametrize("target", [None, "bf16"])
def test_dequantized_values_equal_the_modelopt_path(capsys, broken_export, ct_export, tmp_path, target):
    extra = ("--target", target) if target else ()
    want = _modelopt_fix(broken_export, tmp_path / "modelopt", capsys, *extra)
    assert run_captured(capsys, "fix", ct_export, "-o", tmp_path / "ct", "--quiet", *extra)[0] == 0
    got, source = load_tensors(tmp_path / "ct"), load_tensors(ct_export)
    dequantized = [k for k in got if k.endswith(".weight") and f"{k[:-7]}.weight_packed" in source]
    assert {k for k in got if k not in dequantized} <= set(source)  # the rest stays in compressed-tensors' names
    assert len(dequantized) == (12 if target else 2)
    for name in dequantized:
        a, b = want[name], got[name]
        assert a.dtype == b.dtype == torch.bfloat16 and torch.equal(a, b), name  # equal values
        differs = a.view(torch.int16) != b.view(torch.int16)
        assert (a[differs] == 0).all(), f"{name}: bits differ beyond the sign of zero"  # E2M1 code 8 is -0 in compressed-tensors
    if target == "bf16":
        assert "quantization_config" not in read_json(tmp_path / "ct" / "config.json")


@pytest.mark.parametrize("args, reason", [
    (("--original", "ORIG"), "--original verifies the original by requantizing with ModelOpt's math"),
    (("--tp", "2"), "--tp reshards ModelOpt names only"),
])
def test_unsupported_operations_are_refused_in_one_line(capsys, ct_export, original_model, tmp_path, args, reason):
    args = tuple(str(original_model) if a == "ORIG" else a for a in args)
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", ct_export, "-o", out, "--quiet", *args)
    assert code == 2 and not out.exists()
    assert err.strip().count("\n") == 0 and f"{ct_export}: compressed-tensors checkpoint: {reason}" in err


def test_other_compressed_tensors_formats_are_refused(capsys, ct_export, tmp_path):
    folder = tmp_path / "fp8"
    folder.mkdir()
    for f in ct_export.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    config = read_json(folder / "config.json")
    config["quantization_config"]["format"] = "float-quantized"
    config["quantization_config"]["config_groups"]["config_group_0"]["format"] = "float-quantized"
    (folder / "config.json").write_text(json.dumps(config))
    code, _, err = run_captured(capsys, "inspect", folder)
    assert code == 2
    assert err == (f"error: {folder / 'config.json'}: compressed-tensors format float-quantized is not supported; "
                   "this tool repairs nvfp4-pack-quantized (NVFP4) checkpoints\n")


def test_a_stray_weight_beside_weight_packed_is_bad_input(capsys, ct_export, tmp_path):
    """A module that stores both `weight_packed` and a `weight`: dequantizing would write a second
    `post_projection.weight`. That is the input's defect (exit 2, before anything is written), not a
    failed check of our own plan (exit 3)."""
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "stray"
    folder.mkdir()
    for f in ct_export.iterdir():
        if f.suffix == ".json" and not f.name.endswith(".index.json"):
            (folder / f.name).write_bytes(f.read_bytes())
    tensors = load_file(ct_export / "model.safetensors")
    tensors["post_projection.weight"] = torch.zeros(96, 64, dtype=torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    before = tree_hashes(folder)
    for dry in ((), ("--dry-run",)):
        code, _, err = run_captured(capsys, "fix", folder, "-o", tmp_path / "out", "--quiet", *dry)
        assert code == 2 and err.count("\n") == 1, err
        assert "post_projection.weight" in err and "post_projection.weight_packed" in err and "internal error" not in err, err
    assert not (tmp_path / "out").exists() and tree_hashes(folder) == before


def test_fix_for_tensorrt_llm_names_the_handshake_as_its_loader_asks(capsys, ct_export, tmp_path):
    """TensorRT-LLM's module-driven loader asks each module under its checkpoint name (`post_projection`, not vLLM's
    `draft_model.post_projection`): the entry fix writes for it is used, and fix's output passes doctor --strict. It
    exited 3 ('exclusion post_projection matches no module'), its self-check judging the entry by vLLM's names."""
    out = tmp_path / "out"
    code, _, err = run_captured(capsys, "fix", ct_export, "-o", out, "--target", "trtllm==1.2.0", "--quiet")
    assert code == 0, err
    code, report, err = run_captured(capsys, "doctor", out, "--target", "trtllm==1.2.0", "--strict", "--json")
    assert code == 0, report


@pytest.mark.parametrize("targets", ["vllm==0.32.0,trtllm==1.2.0", "vllm==0.28.0,vllm==0.32.0,sglang==0.5.23,trtllm==1.2.0"])
def test_fix_for_vllm_and_tensorrt_llm_keeps_the_entries_each_reads(capsys, ct_export, tmp_path, targets):
    """TensorRT-LLM < 1.3 reads no `re:` entry, vLLM matches the drafter's `draft_model.` names only through one: fix
    rewrote every `re:` entry as a plain name, vLLM then built the handshake NVFP4 over BF16 weights and fix's
    self-check exited 3. Both entries are written, and the output passes doctor --strict for each target."""
    ignore = _fixed_for_each(capsys, ct_export, tmp_path / "out", targets)
    assert set(ENTRIES) | set(HANDSHAKE) <= set(ignore), ignore


def _fixed_for_each(capsys, src, out, targets: str) -> list[str]:
    """fix --target `targets` into `out`; its `ignore` list, once doctor --strict passes the output for each target."""
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--target", targets, "--quiet")
    assert code == 0, err
    for target in targets.split(","):
        code, report, _ = run_captured(capsys, "doctor", out, "--target", target, "--strict")
        assert code == 0, (target, report)
    return read_json(out / "config.json")["quantization_config"]["ignore"]


@pytest.mark.parametrize("ignore, targets", [
    (["lm_head", "post_projection"], "vllm==0.32.0,trtllm==1.2.0"),
    (["lm_head", "pre_projection", "post_projection", "post_projection", "lm_head"], "vllm==0.32.0,trtllm==1.2.0"),
    (["lm_head", "re:(.*\\.)?pre_projection$", "pre_projection", "re:(.*\\.)?pre_projection$"],
     "vllm==0.32.0,sglang==0.5.23,trtllm==1.2.0,trtllm==1.4.0"),
])
def test_fix_for_several_targets_keeps_an_entry_listed_before_that_one_target_reads(capsys, ct_export, tmp_path, ignore, targets):
    """An export already listing TensorRT-LLM < 1.3's plain `post_projection` (vLLM asks `draft_model.post_projection`,
    so to vLLM it names no module): fix took it out as unused to one target although another target reads it as its
    module's own name, so fix --target vllm,trtllm==1.2 refused ('TensorRT-LLM builds post_projection as nvfp4')."""
    src = tmp_path / "src"
    shutil.copytree(ct_export, src)
    config = read_json(src / "config.json")
    config["quantization_config"]["ignore"] = ignore
    (src / "config.json").write_text(json.dumps(config))
    written = _fixed_for_each(capsys, src, tmp_path / "out", targets)
    assert set(ENTRIES) | set(HANDSHAKE) <= set(written), written
