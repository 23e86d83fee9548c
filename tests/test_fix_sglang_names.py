"""`fix --target sglang==X` writes its exclusions where, and under the names, each SGLang release reads them (#28):

- compressed-tensors, SGLang 0.5.23 on Llama: no packed mapping, so `should_ignore_layer` asks the fused `qkv_proj`
  itself; shard-name `ignore` entries leave it unignored and without a config-group target (the real `ct-llama-dense`
  config refuses to build). The output names the fused layer too (vLLM's shard test still reads the shards).
- ModelOpt's nested block in config.json: SGLang merges quant_algo into it and reads only its top level (the flat
  branch's `ignore`), vLLM only the nested `quantization.exclude_modules`; the output carries the list in both places.
- SGLang 0.5.9 / 0.5.10 read a fused layer only by its own name (no fallback to q/k/v): the output names `qkv_proj`.
- Module names holding characters a runtime reads as a pattern are refused in one line, never written verbatim.

The judge is doctor --strict for every target on the output (the SGLang tier loads the same outputs in SGLang's own
model code: tests/sglang/test_fix_loads_in_sglang.py; the vLLM tier in vLLM's: tests/vllm/test_multitarget_fix_loads_in_vllm.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import run_captured
from tests.sglang.fixtures import FIXTURES
from tests.test_runtime_sglang import layout

BOTH = "vllm==0.32.0,sglang==0.5.23"


def fixture(root: Path, name: str) -> Path:
    return FIXTURES[name][1](root / name)


def fix_is_clean(capsys, src: Path, out: Path, targets: str) -> None:
    code, _, err = run_captured(capsys, "fix", src, "-o", out, "--target", targets)
    assert code == 0, err
    for target in targets.split(","):
        code, text, err = run_captured(capsys, "doctor", out, "--target", target, "--strict")
        assert code == 0, (target, text, err)


@pytest.mark.parametrize("targets", [BOTH, "sglang==0.5.23"])
def test_compressed_tensors_ignore_names_the_fused_layer_sglang_asks(capsys, tmp_path, targets):
    src = fixture(tmp_path, "ct-llama-dense")
    fix_is_clean(capsys, src, tmp_path / "out", targets)
    ignore = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]["ignore"]
    assert r"re:.*\.self_attn\.q_proj$" in ignore  # what vLLM's per-shard test reads is kept
    assert any("qkv_proj" in e for e in ignore), ignore


@pytest.mark.parametrize("targets", [BOTH, "sglang==0.5.23"])
def test_nested_modelopt_exclusions_are_also_written_where_sglang_reads_them(capsys, tmp_path, targets):
    src = fixture(tmp_path, "modelopt-eagle3-draft")
    fix_is_clean(capsys, src, tmp_path / "out", targets)
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    nested = qc["quantization"]["exclude_modules"]
    assert "lm_head" in nested and "fc" in nested  # vLLM's (nested) list
    assert qc["ignore"] == nested  # SGLang's flat branch


@pytest.mark.parametrize("release", ["0.5.9", "0.5.10"])
@pytest.mark.parametrize("bf16, exclude", [(r"^model\.layers\.0\.self_attn\.q_proj$|^lm_head$", "model.layers.0.self_attn.q_proj"),
                                           (r"\.self_attn\.q_proj$|^lm_head$", "*.self_attn.q_proj")])
def test_releases_reading_only_the_fused_name_get_it(capsys, tmp_path, release, bf16, exclude):
    src = layout(tmp_path, "qwen3-32b", bf16=bf16, exclude=["lm_head", exclude])
    for i, targets in enumerate((f"sglang=={release}", f"vllm==0.32.0,sglang=={release}")):
        fix_is_clean(capsys, src, tmp_path / f"out{i}", targets)
        listed = json.loads((tmp_path / f"out{i}" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
        assert "model.layers.0.self_attn.qkv_proj" in listed, listed


@pytest.mark.parametrize("name", ["model.layers.0.mlp.down_proj(1)", "model.layers.0.mlp.down_proj+x", "model.layers.0.mlp.down$proj"])
def test_a_module_name_runtimes_read_as_a_pattern_is_refused_in_one_line(capsys, tmp_path, name):
    """SGLang turns a ModelOpt entry into a regex with only `.` and `*` escaped (is_layer_excluded), vLLM and
    TensorRT-LLM read `*?[` as a glob: an entry written verbatim for such a module would name other modules, or none,
    or stop SGLang with re.error. The fix refuses it in one line before writing anything."""
    import torch
    from safetensors.torch import load_file, save_file

    from tools.real_fixture import write_real_model

    src = write_real_model(tmp_path / "src", "qwen3-32b")
    tensors = load_file(src / "model.safetensors")
    copy = "model.layers.0.mlp.down_proj."
    tensors.update({name + "." + k[len(copy):]: v.clone() for k, v in tensors.items() if k.startswith(copy)})
    save_file({k: v.contiguous() for k, v in tensors.items()}, src / "model.safetensors", metadata={"format": "pt"})
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[[rules]]\naction = "dequantize"\nmodules = [{json.dumps(name)}]\n')
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "nothing was written" in err and repr(name) in err and not (tmp_path / "out").exists()
    assert torch.equal(load_file(src / "model.safetensors")[name + ".weight"], tensors[name + ".weight"])


@pytest.mark.parametrize("key", ["ignore", "modules_to_not_convert"])
@pytest.mark.parametrize("targets", ["sglang==0.5.23", "sglang==0.5.9", BOTH])
def test_a_top_level_list_sglang_already_read_keeps_its_entries(capsys, tmp_path, key, targets):
    """A nested ModelOpt block whose top level already holds a list that differs from the nested one: SGLang builds
    from the top-level list. The copy written there keeps the entries SGLang read (here `lm_head`, stored BF16 and
    missing from the nested list), besides the fix's own, so no layer SGLang built BF16 becomes quantized."""
    src = fixture(tmp_path, "modelopt-eagle3-draft")
    config = json.loads((src / "config.json").read_text())
    qc = config["quantization_config"]
    qc["quantization"]["exclude_modules"] = ["model.embed_tokens"]
    qc[key] = ["lm_head"]
    (src / "config.json").write_text(json.dumps(config))
    fix_is_clean(capsys, src, tmp_path / "out", targets)
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert "lm_head" in qc["ignore"] and "fc" in qc["ignore"], qc


@pytest.mark.parametrize("targets", [(), ("--target", "trtllm==1.3.0"), ("--target", "vllm==0.32.0,sglang==0.5.23")])
def test_a_module_name_starting_with_re_colon_is_refused_in_one_line(capsys, tmp_path, targets):
    """TensorRT-LLM >= 1.3 reads a ModelOpt entry starting `re:` as a regex (re.fullmatch of the rest): an entry
    written as the name of a module called `re:model.layers.N.mlp.down_proj` would exclude the real
    `model.layers.N.mlp.down_proj` instead. The fix refuses it in one line (was: written verbatim, exit 3 for 1.3)."""
    from safetensors.torch import load_file, save_file

    from tools.real_fixture import write_real_model

    src = write_real_model(tmp_path / "src", "qwen3-32b")
    tensors = load_file(src / "model.safetensors")
    layers = sorted({k.split(".")[2] for k in tensors if k.startswith("model.layers.")})
    for n in layers:
        copy = f"model.layers.{n}.mlp.down_proj."
        tensors.update({"re:" + copy + k[len(copy):]: v.clone() for k, v in list(tensors.items()) if k.startswith(copy)})
    save_file({k: v.contiguous() for k, v in tensors.items()}, src / "model.safetensors", metadata={"format": "pt"})
    recipe = tmp_path / "r.toml"
    recipe.write_text('[[rules]]\naction = "dequantize"\nmodules = [\'re:re:model\\.layers\\.\\d+\\.mlp\\.down_proj\']\n')
    code, _, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--recipe", recipe, *targets)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "nothing was written" in err and "'re:'" in err and not (tmp_path / "out").exists()


def test_a_nested_block_with_quant_algo_also_at_its_top_level_is_read_flat_by_sglang(capsys, tmp_path):
    """SGLang 0.5.23 (configs/model_config.py `_parse_quant_hf_config` copies the nested block's quant_algo to the top
    level, overwriting one already there; ModelOptFp4Config.from_config then takes the flat branch) reads the
    top-level `ignore` whether or not the input already had a top-level quant_algo: a layer listed only in the
    nested block is built quantized by SGLang, so a packed layer there is no error for it."""
    from tests.test_runtime_sglang import doctor, errors

    src = fixture(tmp_path, "modelopt-eagle3-draft")
    config = json.loads((src / "config.json").read_text())
    qc = config["quantization_config"]
    qc.update(quant_algo="NVFP4", ignore=["lm_head"])
    qc["quantization"]["exclude_modules"] = ["lm_head", "layers.0.mlp.down_proj"]
    (src / "config.json").write_text(json.dumps(config))
    _, report = doctor(capsys, src, "sglang==0.5.23")
    assert "layers.0.mlp.down_proj" not in errors(report), errors(report)
    fix_is_clean(capsys, src, tmp_path / "out", BOTH)
    qc = json.loads((tmp_path / "out" / "config.json").read_text())["quantization_config"]
    assert "fc" in qc["ignore"] and "lm_head" in qc["ignore"], qc


@pytest.mark.parametrize("targets", ["sglang==0.5.23", "sglang==0.5.9", BOTH])
def test_nested_entries_sglang_never_read_are_not_copied_where_it_reads(capsys, tmp_path, targets):
    """The nested list names a layer stored packed (vLLM's problem, not a target here when SGLang is alone); SGLang
    read the top-level list, which does not. The top level keeps what SGLang read plus the fix's own entries: copying
    the nested list there would make SGLang build the packed layer BF16 (was exit 3 on this valid input)."""
    src = fixture(tmp_path, "modelopt-eagle3-draft")
    config = json.loads((src / "config.json").read_text())
    qc = config["quantization_config"]
    qc["ignore"] = ["lm_head", "fc"]
    qc["quantization"]["exclude_modules"] = ["lm_head", "fc", "layers.0.mlp.down_proj"]
    (src / "config.json").write_text(json.dumps(config))
    fix_is_clean(capsys, src, tmp_path / "out", targets)
