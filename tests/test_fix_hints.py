"""A doctor hint that says what `fix --target` does is true: each test runs the hinted command and checks its output.

"(fix --target does)" stood after "dequantize it" and "dequantize every shard of it" whatever the layout, and fix
refused two of them:
- a fused layer vLLM asks about a shard no module stores (Qwen4Exp's qkv_proj without QSA asks
  `indexer.index_qk_proj`, quant_utils.py is_layer_skipped): exact entries for the stored shards leave the unstored one
  quantized, so vLLM refuses; fix now also writes the fused layer's own name, which vLLM tests first
  (vLLM 0.32 quant_utils.py:662; 0.28: 647; 0.30: 657);
- a module whose scales cannot be read (no weight_scale, no weight_scale_2): dequantizing it is impossible, so fix
  --target refuses; the hint says so, and that fix --target with --original takes it from the original model.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export
from tests.test_qwen4exp_without_qsa import QKV, write

TARGET = "vllm==0.32.0"
DOES = "(fix --target does)"
EMBED = "model.embed_tokens"


def doctor(capsys, folder: Path, *args: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", TARGET, "--json", *args)
    assert code in (0, 1) and not err.strip(), err
    return code, json.loads(out)


def clean(capsys, folder: Path) -> bool:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", TARGET, "--strict")
    return code == 0 or print(out, err)


def q_stored_bf16(folder: Path, listed: bool = True, without_k: bool = False) -> Path:
    """Qwen4Exp without QSA: q_proj stored BF16 (`listed`: and excluded), k/v_proj NVFP4 (`without_k`: k_proj not
    stored either), the indexer shard vLLM asks unstored."""
    write(folder, {})
    gone = (QKV[0], QKV[1]) if without_k else (QKV[0],)
    tensors = {k: v for k, v in load_file(folder / "model.safetensors").items() if k.rpartition(".")[0] not in gone}
    save_file({**tensors, f"{QKV[0]}.weight": torch.zeros(128, 64, dtype=torch.bfloat16)}, folder / "model.safetensors",
              metadata={"format": "pt"})
    quant = json.loads((folder / "hf_quant_config.json").read_text())
    quant["quantization"]["exclude_modules"] += [QKV[0]] if listed else []
    (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    return folder


@pytest.mark.parametrize("listed,without_k", [(True, False), (False, False), (True, True)])
def test_fused_layer_with_an_unstored_shard_is_made_bf16_whole_as_the_hint_says(listed, without_k, tmp_path, capsys):
    src, out = q_stored_bf16(tmp_path / "src", listed, without_k), tmp_path / "out"
    qkv = QKV[0].rpartition(".")[0] + ".qkv_proj"
    hinted = [f for f in doctor(capsys, src)[1]["findings"] if f["code"] == "fused-shards" and DOES in f["message"]]
    assert [f["subject"] for f in hinted] == [qkv], hinted
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET)
    assert code == 0, text + err
    excluded = json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert qkv in excluded and {*QKV[::2]} <= set(excluded), excluded
    assert clean(capsys, out)


def packed_embedding(folder: Path, without: str | None) -> Path:
    """A Llama export whose embedding (a layer vLLM never quantizes) is stored packed NVFP4, `without` one scale."""
    export(folder, "LlamaForCausalLM", "llama", {}, ["lm_head"])
    tensors = load_file(folder / "model.safetensors")
    weight = (torch.randn(64, 32, generator=torch.Generator().manual_seed(3)) * 0.05).to(torch.bfloat16)
    codes, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(weight))
    tensors |= {f"{EMBED}.weight": codes, f"{EMBED}.weight_scale": scale, f"{EMBED}.weight_scale_2": scale_2}
    save_file({k: v for k, v in tensors.items() if k != f"{EMBED}.{without}"}, folder / "model.safetensors",
              metadata={"format": "pt"})
    return folder


def original(folder: Path, like: Path) -> Path:
    """The BF16 model the export was made from (its packed modules dequantized: quantized again with their stored
    global scale they reproduce the stored bytes, which --original checks), the export's config; the embedding
    whose scale is lost, full precision."""
    folder.mkdir(parents=True)
    tensors = load_file(like / "model.safetensors")
    weights = {k: v for k, v in tensors.items() if k.endswith(".weight") and v.dtype == torch.bfloat16}
    for name in {k.rpartition(".")[0] for k in tensors if k.endswith(".weight_scale_2") and f"{k[:-2]}" in tensors}:
        parts = [tensors[f"{name}.{leaf}"] for leaf in ("weight", "weight_scale", "weight_scale_2")]
        weights[f"{name}.weight"] = nvfp4.dequantize(*parts, torch.bfloat16)
    weights[f"{EMBED}.weight"] = torch.randn(64, 32).to(torch.bfloat16)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text((like / "config.json").read_text())
    return folder


def embedding_hint(capsys, src: Path) -> str:
    [hint] = [f["message"] for f in doctor(capsys, src)[1]["findings"] if f["code"] == "config-contradiction" and f["subject"] == EMBED]
    return hint


def test_a_module_that_can_be_dequantized_is_as_the_hint_says(tmp_path, capsys):
    src, out = packed_embedding(tmp_path / "src", None), tmp_path / "out"
    assert DOES in embedding_hint(capsys, src)
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET)
    assert code == 0, text + err
    assert clean(capsys, out)


@pytest.mark.parametrize("without", ["weight_scale", "weight_scale_2"])
def test_a_module_whose_scales_cannot_be_read_gets_the_command_that_repairs_it(tmp_path, capsys, without):
    src = packed_embedding(tmp_path / "src", without)
    hint = embedding_hint(capsys, src)
    assert DOES not in hint and "fix --target refuses" in hint and "--original" in hint, hint
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "refused", "--target", TARGET)
    assert code == 2 and not (tmp_path / "refused").exists(), text + err
    orig, out = original(tmp_path / "orig", src), tmp_path / "out"
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET, "--original", orig)
    assert code == 0, text + err
    assert clean(capsys, out)


@pytest.mark.parametrize("name", ["model.layers.0.mlp.down*proj", "model.layers.0.mlp.down_proj"])
def test_a_module_no_exclusion_entry_can_name_is_not_promised(name, tmp_path, capsys):
    """SGLang 0.5.23 loads a BF16 weight its config builds NVFP4 wrongly (its data's loaders), and the hint said
    "exclude it (fix --target does)"; for a name holding pattern syntax fix refuses (no entry names exactly it)."""
    src = export(tmp_path / "src", "LlamaForCausalLM", "llama", {f"{name}.weight": torch.zeros(32, 32, dtype=torch.bfloat16)},
                 ["lm_head"])
    code, out, err = run_captured(capsys, "doctor", src, "--target", "sglang==0.5.23", "--json")
    [hint] = [f["message"] for f in json.loads(out)["findings"] if f["subject"] == name]
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", "sglang==0.5.23")
    if "*" in name:
        assert DOES not in hint and "fix --target refuses it" in hint and "rename the module" in hint, hint
        assert "write `" not in hint, hint  # an entry holding pattern syntax is not advice
        assert code == 2 and "rename the module" in err and not (tmp_path / "out").exists(), text + err
    else:
        assert DOES in hint and code == 0, hint + text + err
        assert f"write `{name}` in hf_quant_config.json quantization.exclude_modules" in hint, hint
        assert run_captured(capsys, "doctor", tmp_path / "out", "--target", "sglang==0.5.23", "--strict")[0] == 0



def test_every_stored_shard_listed_gets_the_fused_name_doctor_asks_for(tmp_path, capsys):
    """Every stored shard BF16 and listed, the unstored indexer shard not: doctor says "name the fused layer itself";
    fix --target does exactly that (the shards stay as stored), and vLLM then builds the layer BF16 whole."""
    src, out = write(tmp_path / "src", {}, tuple(QKV)), tmp_path / "out"
    qkv = QKV[0].rpartition(".")[0] + ".qkv_proj"
    [hint] = [f["message"] for f in doctor(capsys, src)[1]["findings"] if f["code"] == "fused-shards"]
    assert f"name the fused layer itself ({qkv})" in hint, hint
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET)
    assert code == 0, text + err
    report = json.loads((out / "repair_report.json").read_text())
    assert not report["changes"] and qkv in json.loads((out / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert clean(capsys, out)


def test_a_3d_experts_module_whose_block_scale_is_misshapen_is_not_promised(tmp_path, capsys):
    """ModelOpt's BMM experts store `X_weight_scale` beside `X` (formats/nvfp4_packed._bmm_experts), not `X.weight_scale`:
    a misshapen one is reported on that tensor, and the hint for the excluded packed module `X` still said fix
    --target dequantizes it, while fix --target refuses (its scales cannot be read)."""
    from tests.test_bmm_experts_nvfp4 import gpt_oss_export

    src = gpt_oss_export(tmp_path / "src", tmp_path / "orig")
    module = "model.layers.1.mlp.experts.down_proj"
    tensors = load_file(src / "model.safetensors")
    tensors[f"{module}_weight_scale"] = tensors[f"{module}_weight_scale"][:, :1].contiguous()
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    for name, key in (("config.json", "quantization_config"), ("hf_quant_config.json", "quantization")):
        config = json.loads((src / name).read_text())
        listed = config[key]["ignore" if key == "quantization_config" else "exclude_modules"]
        listed.append(module)
        (src / name).write_text(json.dumps(config))
    [hint] = [f["message"] for f in doctor(capsys, src)[1]["findings"] if f["subject"] == module and f["code"] == "config-contradiction"]
    assert DOES not in hint and "fix --target refuses" in hint and "--original" in hint, hint
    code, text, err = run_captured(capsys, "fix", src, "-o", tmp_path / "refused", "--target", TARGET)
    assert code == 2 and not (tmp_path / "refused").exists(), text + err
    out = tmp_path / "out"  # the command the hint names: the module from the original, and the output passes
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET, "--original", tmp_path / "orig")
    assert code == 0, text + err
    assert torch.equal(load_file(out / "model.safetensors")[module], load_file(tmp_path / "orig" / "model.safetensors")[module])
    assert clean(capsys, out)
