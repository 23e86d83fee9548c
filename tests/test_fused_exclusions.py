"""Exclusion entries of a layer vLLM builds fused from shards (Llama's qkv_proj from q/k/v_proj), judged as vLLM judges
them: `is_layer_excluded` (modelopt.py:187-222, 0.28-0.32) first asks `is_layer_skipped` with the FUSED layer's prefix
(quant_utils.py:617-690: that exact name listed, else every shard's exact name listed, a mix raising), then tests every
entry as a substring of, and an fnmatch pattern against, the fused layer's prefix (`...qkv_proj`), never a shard's.
compressed-tensors' `should_ignore_layer` (compressed_tensors/utils.py:53-70, config_utils.py:344-380) tests the fused
name (equal or `re:`) first, then each shard. The release's data (`fused_exclusions`, tools/vllm_fused_exclusions.py)
says which names each test is asked of; tests/vllm/test_asked_prefixes_vs_vllm.py judges these cases with vLLM's loader.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from repair.codec import nvfp4
from tests.conftest import run_captured
from tests.test_fix_runtime_prefixes import export

ATTN = "model.layers.0.self_attn"
SHARDS = ("q_proj", "k_proj", "v_proj")


def llama_qkv_bf16(root: Path, entries: list[str]) -> Path:
    """Layer 0's q/k/v stored BF16, layer 1's packed NVFP4 with one global scale; `entries` beside lm_head."""
    gen = torch.Generator().manual_seed(2)
    extra = {}
    for layer in range(2):
        weights = {leaf: (torch.randn(32, 32, generator=gen) * 0.05).to(torch.bfloat16) for leaf in SHARDS}
        shared = nvfp4.global_scale(torch.cat(list(weights.values())))
        for leaf, weight in weights.items():
            name = f"model.layers.{layer}.self_attn.{leaf}"
            if layer == 0:
                extra[f"{name}.weight"] = weight
                continue
            codes, scale, scale_2 = nvfp4.quantize(weight, shared.clone())
            extra.update({f"{name}.weight": codes, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
                          f"{name}.input_scale": torch.tensor(0.01)})
    return export(root, "LlamaForCausalLM", "llama", extra, ["lm_head", *entries])


# case -> (entries, whether vLLM 0.28-0.32 builds layer 0's qkv_proj BF16, so the BF16 shards load)
CASES = {
    "fused-exact": ([f"{ATTN}.qkv_proj"], True),  # is_layer_skipped's exact test of the fused name
    "shards-exact": ([f"{ATTN}.{s}" for s in SHARDS], True),  # every shard's exact name
    "fused-substring": (["layers.0.self_attn.qkv"], True),  # a substring of the fused prefix
    "fused-fnmatch": (["*.layers.0.self_attn.qkv?proj"], True),  # fnmatch against the fused prefix (no trailing `*`:
    # where the class has a weight mapper, vLLM rewrites `X*` as `X` and `X.*`, modelopt.py apply_vllm_mapper)
    "shard-substring": ([f"layers.0.self_attn.{s}" for s in SHARDS], False),  # substrings of shards, not of qkv_proj
    "shard-fnmatch": ([f"*.layers.0.self_attn.{s}" for s in SHARDS], False),  # fnmatch of shards only
    # LlamaForCausalLM has a mapper (llama.py:473), so vLLM splits `X*` into `X` and `X.*` (modelopt.py:262-281; 256-275
    # in 0.28): `...qkv_` and `...qkv_.*` reach nothing; `layers.0.self_attn.q` is a substring of `...qkv_proj`
    "fused-trailing-star": (["*.layers.0.self_attn.qkv_*"], False),
    "split-trailing-star": (["layers.0.self_attn.q*"], True),
}


@pytest.mark.parametrize("target", ["vllm==0.32.0", "vllm==0.28.0"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_layer_entries_are_judged_on_the_fused_prefix(capsys, tmp_path, case, target):
    entries, loads = CASES[case]
    code, out, err = run_captured(capsys, "doctor", llama_qkv_bf16(tmp_path / "x", entries), "--target", target)
    assert (code == 0) is loads, out + err
    if not loads:
        for shard in SHARDS:
            assert f"{ATTN}.{shard}: stored bf16, but {target} builds it nvfp4" in out, out


# Where another runtime's rule differs (its data's matchers, tests/sglang/test_profile_vs_sglang.py asks SGLang 0.5.23's
# own functions): case -> {target: doctor's exit}. SGLang 0.5.23 tests shards by dotted path (_module_path_match), so
# a shard's name minus `model.` reaches it, and turns only `*` of a glob into a regex (`?` stays a regex `?`); 0.5.9 has
# no packed mapping for Llama and asks `qkv_proj` alone, by substring (utils.py is_layer_skipped, read from its wheel)
OTHER_RULES = {
    "shard-substring": {"sglang==0.5.23": 0, "sglang==0.5.9": 1},
    "fused-fnmatch": {"sglang==0.5.23": 1, "sglang==0.5.9": 1},
    "fused-substring": {"sglang==0.5.23": 1, "sglang==0.5.9": 0},
    "shards-exact": {"sglang==0.5.23": 0, "sglang==0.5.9": 1},
}


@pytest.mark.parametrize("case,target", [(c, t) for c in sorted(OTHER_RULES) for t in sorted(OTHER_RULES[c])])
def test_other_runtimes_judge_the_same_entries_by_their_own_rules(capsys, tmp_path, case, target):
    code, out, err = run_captured(capsys, "doctor", llama_qkv_bf16(tmp_path / "x", CASES[case][0]), "--target", target)
    assert code == OTHER_RULES[case][target], out + err


def ct_llama_qkv_bf16(root: Path, entries: list[str]) -> Path:
    """`llama_qkv_bf16` converted by compressed-tensors' own converter (tools/ct_export.py), `entries` its `ignore`."""
    from tools.ct_export import convert_modelopt

    src = llama_qkv_bf16(root / "modelopt", entries)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "kv_cache_quant_algo": None, "ignore": ["lm_head", *entries]}
    (src / "config.json").write_text(json.dumps(config))
    out = convert_modelopt(src, root / "ct")
    (out / "hf_quant_config.json").unlink(missing_ok=True)
    assert json.loads((out / "config.json").read_text())["quantization_config"]["ignore"] == ["lm_head", *entries]
    return out


# compressed-tensors: case -> (ignore entries, {release: whether it builds layer 0's qkv_proj BF16 (None: refuses it)})
CT_CASES = {
    "fused-exact": ([f"{ATTN}.qkv_proj"], {"0.32.0": True, "0.28.0": True}),
    "shards-regex": ([r"re:.*layers\.0\.self_attn\.[qkv]_proj$"], {"0.32.0": True, "0.28.0": True}),
    # 0.28 tests the fused name for equality only (compressed_tensors/utils.py should_ignore_layer), 0.30+ `re:` too
    "fused-regex": ([r"re:.*layers\.0\.self_attn\.qkv_proj$"], {"0.32.0": True, "0.28.0": False}),
    # re.match: q_proj and qkv_proj, not k/v: 0.32 ignores the fused layer first, 0.28 finds its shards disagree
    "fused-and-one-shard-regex": ([r"re:.*layers\.0\.self_attn\.q"], {"0.32.0": True, "0.28.0": None}),
}


@pytest.mark.parametrize("release", ["0.32.0", "0.28.0"])
@pytest.mark.parametrize("case", sorted(CT_CASES))
def test_compressed_tensors_ignore_of_a_fused_layer_per_release(capsys, tmp_path, case, release):
    entries, loads = CT_CASES[case]
    src = ct_llama_qkv_bf16(tmp_path / "x", entries)
    code, out, err = run_captured(capsys, "doctor", src, "--target", f"vllm=={release}")
    assert (code == 0) is bool(loads[release]), out + err
    if loads[release] is None:
        assert (f"Found a different quantization schemes for ['q_proj', 'k_proj', 'v_proj'] in {ATTN}.qkv_proj. "
                "vLLM requires all to use the same scheme.") in out, out


@pytest.mark.parametrize("targets", ["vllm==0.32.0", "vllm==0.32.0,sglang==0.5.23", "vllm==0.28.0,sglang==0.5.9,trtllm==1.0"])
@pytest.mark.parametrize("case", ["shard-substring", "shard-fnmatch"])
def test_fix_of_entries_vllm_never_applies_writes_entries_it_reads(capsys, tmp_path, case, targets):
    """fix --target keeps its promise on entries vLLM never applies to the fused layer (SGLang 0.5.23 reads the
    substrings as dotted paths): the output passes doctor --strict for every target (its entries name every shard
    exactly, which is_layer_skipped reads, or the fused layer)."""
    src = llama_qkv_bf16(tmp_path / "src", CASES[case][0])
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", targets)
    assert code == 0, out + err
    written = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert {f"{ATTN}.{s}" for s in SHARDS} <= set(written) or f"{ATTN}.qkv_proj" in written, written
    for target in targets.split(","):
        code, out, err = run_captured(capsys, "doctor", tmp_path / "out", "--target", target, "--strict")
        assert code == 0, out + err


@pytest.mark.parametrize("entry", ["layers.0.self_attn.gate_proj", "model.layers.0.self_attn.gate_proj", "*.self_attn.gate_proj"])
def test_a_shard_named_layer_the_class_builds_on_its_own_is_asked_by_its_own_name(entry):
    """Afmoe's attention gate_proj is a ColumnParallelLinear of its own (vLLM 0.32's row), not a shard of a gate_up_proj:
    is_layer_skipped sees `gate_proj`, no packed key, and tests its own name, by substring and fnmatch too."""
    from repair.formats.base import Declaration
    from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
    from repair.targets.profiles import resolve

    target = resolve("vllm==0.32.0")
    row = target.release.row("AfmoeForCausalLM")
    declared = target.bind(Declaration("NVFP4", None, (entry,), MODELOPT_NVFP4), row, {"architectures": ["AfmoeForCausalLM"]})
    assert declared.excludes("model.layers.0.self_attn.gate_proj")
    assert not declared.excludes("model.layers.0.mlp.gate_proj")  # the MLP's is a shard: gate_up_proj is asked


# A shard leaf two fused layers of one class share (vLLM 0.32's packed_modules_mapping): OlmoHybrid's q/k/v_proj are
# shards of self_attn.qkv_proj and of linear_attn.in_proj_qkvg (olmo_hybrid.py:385-389), DeepSeek-V4's wkv of
# attn.fused_wqa_wkv and of attn.compressor.fused_wkv_wgate (deepseek_v41/nvidia/model.py:1550-1553). vLLM asks the
# layer the class builds (its prefix), so the shard is asked under the fused layer its parent holds, as the row says.
SHARED_SHARDS = {
    "olmo-fused-exact": ("OlmoHybridForCausalLM", ["model.layers.0.self_attn.qkv_proj"],
                         {"model.layers.0.self_attn.q_proj": True, "model.layers.0.linear_attn.q_proj": False}),
    "olmo-shards-exact": ("OlmoHybridForCausalLM", [f"model.layers.0.self_attn.{s}" for s in SHARDS],
                          {"model.layers.0.self_attn.v_proj": True, "model.layers.0.linear_attn.v_proj": False}),
    "olmo-linear-fused": ("OlmoHybridForCausalLM", ["model.layers.0.linear_attn.in_proj_qkvg"],
                          {"model.layers.0.linear_attn.q_proj": True, "model.layers.0.self_attn.q_proj": False}),
    "dsv4-attn-fused": ("DeepseekV4ForCausalLM", ["model.layers.0.attn.fused_wqa_wkv"],
                        {"model.layers.0.attn.wkv": True, "model.layers.0.attn.wq_a": True,
                         "model.layers.0.attn.compressor.wkv": False}),
    "dsv4-compressor-fused": ("DeepseekV4ForCausalLM", ["model.layers.0.attn.compressor.fused_wkv_wgate"],
                              {"model.layers.0.attn.compressor.wkv": True, "model.layers.0.attn.wkv": False}),
}


@pytest.mark.parametrize("case", sorted(SHARED_SHARDS))
def test_a_shard_leaf_of_two_fused_layers_is_asked_under_the_one_its_parent_builds(case):
    from repair.formats.base import Declaration
    from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
    from repair.targets.profiles import resolve

    arch, entries, want = SHARED_SHARDS[case]
    target = resolve("vllm==0.32.0")
    declared = target.bind(Declaration("NVFP4", None, tuple(entries), MODELOPT_NVFP4), target.release.row(arch),
                           {"architectures": [arch]})
    assert {name: declared.excludes(name) for name in want} == want
    rule = declared.rule()
    assert all(rule.fused_refusal(*rule.layer(name)) is None for name in want)


@pytest.mark.parametrize("targets", ["vllm==0.28.0,sglang==0.5.9", "vllm==0.32.0,sglang==0.5.9", "vllm==0.32.0"])
@pytest.mark.parametrize("entry", ["v_proj", "*v_proj"])
def test_fix_writes_every_shard_of_a_fused_layer_when_one_is_covered_by_a_substring_of_the_fused_name(capsys, tmp_path,
                                                                                                    entry, targets):
    """`v_proj` is a substring of `...qkv_proj` (vLLM excludes every qkv_proj by it, layer 1's stored NVFP4 too) and of
    `...v_proj`, not of q/k_proj: a target reading shard names (SGLang 0.5.9) needs q/k_proj's exact entries, and exact
    entries for q and k without v are a mix vLLM's is_layer_skipped refuses before its substring test. fix had stopped
    on its own self-check (exit 3); it writes every shard of the layer, or none."""
    src = llama_qkv_bf16(tmp_path / "src", [entry])
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", targets)
    assert code == 0, out + err
    for target in targets.split(","):
        code, out, err = run_captured(capsys, "doctor", tmp_path / "out", "--target", target, "--strict")
        assert code == 0, out + err


@pytest.mark.parametrize("target", ["vllm==0.32.0", "vllm==0.30.0", "vllm==0.28.0"])
@pytest.mark.parametrize("q_lora_rank, own", [(None, True), (8, False), ("absent", False)])
def test_deepseek_v2_lite_kv_a_proj_is_asked_by_its_own_name(target, q_lora_rank, own):
    """vLLM builds DeepSeek-V2's fused_qkv_a_proj only where q_lora_rank is set (0.32 deepseek_v2.py:1051-1065, and adds
    it to the packed mapping at :1903-1909); with q_lora_rank null (DeepSeek-V2-Lite) kv_a_proj_with_mqa is a
    ReplicatedLinear of its own, asked by its own name, so an entry naming it (a substring of its prefix,
    modelopt.py:206-215) excludes it. The profile's row is the q_lora_rank build; the null build is its `variants`
    (tools/vllm_variants.py, built again with the field null). Absent, transformers' DeepseekV2Config defaults it to
    1536: the fused build, whose prefix `...fused_qkv_a_proj` the entry is no substring of."""
    from repair.formats.base import Declaration
    from repair.formats.modelopt_nvfp4 import MODELOPT_NVFP4
    from repair.targets.profiles import resolve

    target = resolve(target)
    config = {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "num_hidden_layers": 2}
    config |= {} if q_lora_rank == "absent" else {"q_lora_rank": q_lora_rank}
    entry = ("layers.0.self_attn.kv_a_proj_with_mqa",)  # modelopt.py:206-215: a substring of the layer's own prefix
    family = target.release.row("DeepseekV2ForCausalLM", config=config)
    declared = target.bind(Declaration("NVFP4", None, entry, MODELOPT_NVFP4), family, config)
    assert declared.excludes("model.layers.0.self_attn.kv_a_proj_with_mqa") is own
    assert ("fused_qkv_a_proj" in family.fused_layers) is not own


def llama_fused_qkv_bf16(root: Path, entries: list[str]) -> Path:
    """`llama_qkv_bf16` with each layer's q/k/v stored as one `qkv_proj` (a fused export, as Phi-3's are; layer 1's
    shards share one global scale): vLLM's QKVParallelLinear loads it whole (no shard id), and asks is_layer_skipped
    for `...qkv_proj` all the same."""
    from safetensors.torch import load_file, save_file

    folder = llama_qkv_bf16(root, entries)
    tensors = load_file(folder / "model.safetensors")
    for attn in (ATTN, ATTN.replace(".0.", ".1.")):
        for leaf in ("weight", "weight_scale", "weight_scale_2", "input_scale"):
            parts = [tensors.pop(f"{attn}.{s}.{leaf}") for s in SHARDS if f"{attn}.{s}.{leaf}" in tensors]
            if parts:
                tensors[f"{attn}.qkv_proj.{leaf}"] = torch.cat(parts) if parts[0].dim() else parts[0]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


# case -> (entries, whether vLLM 0.28-0.32 builds the stored qkv_proj BF16): is_layer_skipped keys on the leaf
# `qkv_proj` (quant_utils.py:662-681), stored fused or not: the fused name, then every shard's exact name
FUSED_STORED = {"fused-exact": ([f"{ATTN}.qkv_proj"], True), "shards-exact": ([f"{ATTN}.{s}" for s in SHARDS], True),
                "shard-substring": ([f"layers.0.self_attn.{s}" for s in SHARDS], False)}


@pytest.mark.parametrize("case", sorted(FUSED_STORED))
def test_a_layer_stored_under_its_fused_name_is_asked_as_vllm_asks_a_fused_layer(capsys, tmp_path, case):
    entries, loads = FUSED_STORED[case]
    code, out, err = run_captured(capsys, "doctor", llama_fused_qkv_bf16(tmp_path / "x", entries), "--target", "vllm==0.32.0")
    assert (code == 0) is loads, out + err
