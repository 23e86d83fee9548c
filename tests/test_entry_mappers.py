"""Exclusion lists as vLLM rewrites them with the built class's weight-name mappers (repair/targets/entry_mappers.py,
the profile's `exclusion_mappers`, tools/vllm_exclusion_mappers.py). vLLM's own apply_vllm_mapper on the real classes
judges the same in the tier (tests/vllm/test_entry_mappers_vs_vllm.py, tests/vllm/test_asked_prefixes_vs_vllm.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair import arch
from repair.targets.entry_mappers import NameMapper, rewritten, spelling
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

GPT_OSS = NameMapper.read({"substr": [[".self_attn.", ".attn."]], "suffix": [[".down_proj", ".w2_weight"]]})


def test_a_mapper_applies_its_maps_in_vllms_order_and_drops_what_maps_to_none():
    assert GPT_OSS("model.layers.0.self_attn.o_proj") == "model.layers.0.attn.o_proj"
    assert GPT_OSS("model.layers.0.mlp.experts.down_proj") == "model.layers.0.mlp.experts.w2_weight"
    assert GPT_OSS("model.layers.0.attn.o_proj") == "model.layers.0.attn.o_proj"  # vLLM's own spelling stays
    dropping = NameMapper.read({"prefix": [["model.mtp_layers.", None], ["layers.", "model.layers."]]})
    assert dropping("model.mtp_layers.0.fc") is None and dropping("layers.1.wq") == "model.layers.1.wq"
    regex = NameMapper.read({"regex": [[r"\Alayers\.(\d+)\.attention\.wo\.(\w+)\Z", r"model.layers.\1.self_attn.o_proj.\2"]]})
    assert regex("layers.3.attention.wo.weight") == "model.layers.3.self_attn.o_proj.weight"
    assert regex("layers.3.attention.wo") == "layers.3.attention.wo"  # a module name has no leaf for `\.(\w+)\Z`
    with pytest.raises(KeyError):
        NameMapper.read({"renaming": []})


def test_each_config_kind_rewrites_its_list_as_its_apply_vllm_mapper_does():
    entries = ["model.layers.0.self_attn.qkv_*", "model.layers.0.self_attn.*", "*", "re:.*self_attn.q.*", "lm_head"]
    assert rewritten(entries, (GPT_OSS,), "modelopt") == {
        "model.layers.0.attn.qkv_": ("model.layers.0.self_attn.qkv_*",),
        "model.layers.0.attn.qkv_.*": ("model.layers.0.self_attn.qkv_*",),
        "model.layers.0.attn.*": ("model.layers.0.self_attn.*",), "*": ("*",),
        "re:.*self_attn.q.*": ("re:.*self_attn.q.*",), "lm_head": ("lm_head",)}
    paths = rewritten(entries, (GPT_OSS,), "paths")  # compressed-tensors: no split, `re:` and dotless names kept
    assert list(paths) == ["model.layers.0.attn.qkv_*", "model.layers.0.attn.*", "*", "re:.*self_attn.q.*", "lm_head"]
    assert rewritten(["a*"], (NameMapper.read({}),), "modelopt") == {"a": ("a*",), "a.*": ("a*",)}  # a mapper renaming nothing still splits
    assert rewritten(["a*"], (), "modelopt") == {"a*": ("a*",)}  # no apply_vllm_mapper call, no split


def test_each_apply_vllm_mapper_call_splits_the_list_it_is_handed_again():
    """A build that hands its config two mappers (Gemma3nForCausalLM's own and its inner module's) calls ModelOpt's
    apply_vllm_mapper twice, and each call splits the list the previous one left (modelopt.py:262-281): vLLM 0.32's own
    config, handed two rename mappers, turns `layers.1**` into `layers.1`, `layers.1.*`, `layers.1*.*` (measured), so
    `layers.1` is a substring test that excludes `model.layers.1.self_attn.o_proj`."""
    twice = (NameMapper.read({}), NameMapper.read({}))
    assert list(rewritten(["layers.1**"], twice, "modelopt")) == ["layers.1", "layers.1.*", "layers.1*.*"]
    assert list(rewritten(["layers.1**"], twice[:1], "modelopt")) == ["layers.1*", "layers.1*.*"]


# (release, row) -> the part of the names spelled again today, and why (strict: once spelled as it is, the entry must go). Found
# here with the multimodal rows: Aria's mapper maps `language_model.model.` to `language_model.` and its profile
# records vLLM building its layers as `language_model.model.layers.N...`; not yet read against vLLM
SPELLED_AGAIN: dict[tuple[str, str], str] = {
    ("vllm 0.32.0", "AriaForConditionalGeneration"): "language_model.model.",  # every layer under it
}


def test_every_shipped_row_spells_its_own_layer_names_as_they_are_and_the_checkpoints_as_vllm_does():
    """MappedRule asks with the name vLLM asks: a prefix the profile already records in vLLM's spelling (its
    `prefixes`) and every layer the class builds stay as they are (FalconH1's mapper would turn `mamba.mamba` into
    `mamba.mamba.mamba`), and a checkpoint module the mapper renames is asked under its new name."""
    again = []
    for profile in arch.PROFILES:
        for name, entry in profile.entries.items():
            spell = spelling(entry)
            asked = [*entry.get("prefixes", {}).values(), *entry["modules"]]
            for prefix in (p.replace("*", "0") for p in asked if p and "{" not in p):
                if (profile.label, name) in SPELLED_AGAIN and spell(prefix) != prefix:
                    again.append(((profile.label, name), prefix))
                    continue
                assert spell(prefix) == prefix, (profile.label, name, prefix)
            if name == "GptOssForCausalLM":
                assert spell("model.layers.0.self_attn.o_proj") == "model.layers.0.attn.o_proj", profile.label
            if name == "FalconH1ForCausalLM":
                assert spell("model.layers.0.mamba.in_proj") == "model.layers.0.mamba.mamba.in_proj", profile.label
    assert {row for row, _ in again} == set(SPELLED_AGAIN), again
    assert all(prefix.startswith(SPELLED_AGAIN[row]) for row, prefix in again), again


def test_every_profiled_release_records_llamas_mapper():
    """LlamaForCausalLM has an hf_to_vllm_mapper (stacked maps only) in 0.28, 0.30 and 0.32: recorded, renaming nothing."""
    for profile in arch.PROFILES:
        if profile.runtime == "vllm":
            assert profile.entries["LlamaForCausalLM"].get("exclusion_mappers") == [{}], profile.label


def test_a_class_built_once_records_one_mapper_call():
    """ApertusForCausalLM is no SupportsQuant: initialize_model hands its mapper to the quant config once
    (configure_quant_config, model_loader/utils.py:88 in 0.32). Its XIELU activation calls .item() while built, so the
    profiler's meta-device build fails and it builds again on CPU with a fresh config: only that build's calls count."""
    for profile in arch.PROFILES:
        if profile.runtime == "vllm":
            assert profile.entries["ApertusForCausalLM"].get("exclusion_mappers") == [{}], profile.label


def gpt_oss_o_proj_bf16(root, entries: list[str]):
    """A GptOss export (o_proj NVFP4 in both layers) with layer 0's o_proj stored BF16 and `entries` listed."""
    folder = export(root, "GptOssForCausalLM", "gpt_oss", {}, ["lm_head", *entries])
    tensors = load_file(folder / "model.safetensors")
    name = "model.layers.0.self_attn.o_proj"
    for leaf in [n for n in tensors if n.startswith(name + ".")]:
        tensors.pop(leaf)
    tensors[f"{name}.weight"] = torch.zeros(32, 32, dtype=torch.bfloat16)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("entry", ["model.layers.0.self_attn.o_proj", "model.layers.0.attn.o_proj", "layers.0.attn.o"])
def test_an_entry_in_either_spelling_excludes_the_layer_vllm_names_after_its_mapper(capsys, tmp_path, entry):
    """GptOss's mapper renames `.self_attn.` to `.attn.` (gpt_oss.py hf_to_vllm_mapper): vLLM maps the entry, then
    tests it against `model.layers.0.attn.o_proj`, so the checkpoint's spelling and vLLM's both exclude it."""
    code, out, err = run_captured(capsys, "doctor", gpt_oss_o_proj_bf16(tmp_path / "x", [entry]), "--target", "vllm==0.32.0")
    assert code == 0, out + err
    used = json.loads(run_captured(capsys, "doctor", tmp_path / "x", "--target", "vllm==0.32.0", "--json")[1])
    assert not [f for f in used["findings"] if f["code"] == "unused-exclusion" and entry in json.dumps(f)], used
