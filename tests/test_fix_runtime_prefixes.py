"""`fix --target vllm==0.32.0` where vLLM matches exclusions on another prefix than the checkpoint's module (#26).

The profile's `prefixes` block (generated from vLLM 0.32's own model code) says which prefix a layer hands the quant
config. Two layouts the vLLM tier found (tests/vllm/test_generated_archs_vs_vllm.py):
- fused 3-D experts stored with no `.weight` leaf (transformers' GraniteMoeSWA / Llama4 / GptOss: `...experts.gate_up_proj`):
  vLLM matches the FusedMoE prefix `...experts`, so fix writes that exclusion, and its output passes doctor --strict;
- a BF16 lm_head in Afmoe / ExaoneMoe, which vLLM builds with the prefix "": no exclusion entry reaches it, and an
  NVFP4 lm_head needs an activation scale no weight gives, so fix refuses in one line (exit 2) saying so; it never
  says "nothing to fix" where doctor finds an error.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from repair.codec import nvfp4
from tests.conftest import run_captured

TARGET = "vllm==0.32.0"
# GptOss: transformers' (and the published BF16 checkpoints') 3-D `mlp.experts.gate_up_proj`, which gpt_oss.py copies
# into the FusedMoE parameters itself (`param.copy_`, no weight_loader): the profile records that copy too
EXPERTS = {"GraniteMoeSWAForCausalLM": ("granitemoe_swa", "block_sparse_moe"), "Llama4ForCausalLM": ("llama4_text", "feed_forward"),
           "GptOssForCausalLM": ("gpt_oss", "mlp")}


def export(root: Path, arch: str, model_type: str, extra: dict[str, torch.Tensor], excluded: list[str]) -> Path:
    """A tiny ModelOpt NVFP4 export: one packed o_proj per layer, BF16 embeddings and lm_head, plus `extra` (BF16)."""
    gen = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(64, 32, generator=gen).to(torch.bfloat16),
               "lm_head.weight": torch.randn(64, 32, generator=gen).to(torch.bfloat16)}
    for layer in range(2):
        name = f"model.layers.{layer}.self_attn.o_proj"
        weight = (torch.randn(32, 32, generator=gen) * 0.05).to(torch.bfloat16)
        packed, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(weight))
        tensors.update({f"{name}.weight": packed, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
                        f"{name}.input_scale": torch.tensor(0.01)})
    tensors.update(extra)
    root.mkdir(parents=True)
    save_file(tensors, root / "model.safetensors", metadata={"format": "pt"})
    (root / "config.json").write_text(json.dumps({"architectures": [arch], "model_type": model_type}))
    (root / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.33.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": excluded}}))
    return root


@pytest.mark.parametrize("arch", sorted(EXPERTS))
def test_fix_excludes_the_fused_moe_prefix_of_leafless_3d_experts(arch, tmp_path, capsys):
    model_type, block = EXPERTS[arch]
    experts = {f"model.layers.{n}.{block}.experts.{p}": torch.zeros(4, 64, 32, dtype=torch.bfloat16)
               for n in range(2) for p in ("gate_up_proj", "down_proj")}
    listed = export(tmp_path / "listed", arch, model_type, experts, ["lm_head", *experts])
    # an entry holding the FusedMoE's name excludes it (is_layer_skipped's experts branch; vLLM 0.32's own
    # is_layer_excluded says so for GptOss and Llama4 after their mappers: tests/vllm/test_routed_expert_entries_vs_vllm.py)
    assert run_captured(capsys, "doctor", "--target", TARGET, listed)[0] == 0
    src = export(tmp_path / "src", arch, model_type, experts, ["lm_head"])
    assert run_captured(capsys, "doctor", "--target", TARGET, src)[0] == 1  # vLLM builds them NVFP4 under `...experts`
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, src, "-o", tmp_path / "out")
    assert code == 0, out + err
    excluded = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert {f"model.layers.{n}.{block}.experts" for n in range(2)} <= set(excluded), excluded
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, "--strict", tmp_path / "out")
    assert code == 0, out + err


@pytest.mark.parametrize("arch,model_type", [("AfmoeForCausalLM", "afmoe"), ("ExaoneMoeForCausalLM", "exaone_moe")])
def test_fix_refuses_a_bf16_lm_head_no_exclusion_can_reach(arch, model_type, tmp_path, capsys):
    src = export(tmp_path / "src", arch, model_type, {}, ["lm_head"])
    assert run_captured(capsys, "doctor", "--target", TARGET, src)[0] == 1
    for dry in ((), ("--dry-run",)):
        code, out, err = run_captured(capsys, "fix", "--target", TARGET, src, "-o", tmp_path / "out", *dry)
        assert code == 2 and "nothing to fix" not in out and not (tmp_path / "out").exists(), out + err
        assert len(err.strip().splitlines()) == 1, err
        assert "lm_head" in err and "prefix ''" in err and "input_scale" in err, err


def test_the_refusals_way_out_works_a_bf16_target_drops_the_config(tmp_path, capsys):
    """The refusal's advice, `--target bf16`, writes a plain BF16 copy: dropping the quantization config settles the
    config's claim that the stored-BF16 lm_head is quantized (doctor's warning for bf16 before)."""
    src = export(tmp_path / "src", "AfmoeForCausalLM", "afmoe", {}, ["lm_head"])
    code, out, err = run_captured(capsys, "fix", "--target", "bf16", src, "-o", tmp_path / "out")
    assert code == 0, out + err
    code, out, err = run_captured(capsys, "doctor", "--target", "bf16", "--strict", tmp_path / "out")
    assert code == 0, out + err


@pytest.mark.parametrize("targets", ["vllm==0.32.0,bf16", "vllm==0.32.0,sglang==0.5.23,bf16"])
def test_a_bf16_target_beside_others_drops_the_config_that_settles_them_all(targets, tmp_path, capsys):
    """No exclusion reaches the BF16 lm_head vLLM 0.32 builds NVFP4 in Afmoe (prefix ""), but with bf16 among the
    targets the output declares no quantization, so every runtime builds it BF16: fix writes that plain copy. Doctor's
    SGLang finding (its loader's error on a stored-BF16 layer built NVFP4, not the config's claim) is one the dropped
    config settles too; it refused. (That SGLang finding is itself the vLLM profile's prefix "" applied to SGLang,
    whose afmoe.py builds lm_head BF16 here, tools/sglang_probe.py says: the SGLang name map's to fix, not this test's.)"""
    src = export(tmp_path / "src", "AfmoeForCausalLM", "afmoe", {}, ["lm_head"])
    assert run_captured(capsys, "doctor", "--target", targets, src)[0] == 1
    code, out, err = run_captured(capsys, "fix", "--target", targets, src, "-o", tmp_path / "out")
    assert code == 0, out + err
    assert not (tmp_path / "out" / "hf_quant_config.json").exists()
    code, out, err = run_captured(capsys, "doctor", "--target", targets, "--strict", tmp_path / "out")
    assert code == 0, out + err


def test_leafless_experts_of_raw_float8_codes_are_never_excluded(tmp_path, capsys):
    """Excluding the FusedMoE prefix makes vLLM build the experts BF16: right for BF16 tensors, garbage for float8 codes
    stored with no scale. Those are refused in one line, never written with an exclusion."""
    experts = {f"model.layers.{n}.feed_forward.experts.{p}": torch.zeros(4, 64, 32).to(torch.float8_e4m3fn)
               for n in range(2) for p in ("gate_up_proj", "down_proj")}
    src = export(tmp_path / "src", "Llama4ForCausalLM", "llama4_text", experts, ["lm_head"])
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, src, "-o", tmp_path / "out")
    assert code == 2 and not (tmp_path / "out").exists() and len(err.strip().splitlines()) == 1, out + err


def test_no_nothing_to_fix_where_doctor_finds_an_error_even_if_planning_thinks_it_settled(tmp_path, capsys, monkeypatch):
    """The net under every derived recipe: a plan that changes nothing while doctor reports an error (or, as --target
    promises doctor --strict, a warning) for the target is refused in one line. Shown with the lm_head filter above
    switched off: the recipe then "dequantizes" the BF16 lm_head, which changes nothing (the bug this file fixed)."""
    from repair.planning import from_target

    monkeypatch.setattr(from_target, "_nameable", lambda chosen, family: chosen)
    src = export(tmp_path / "src", "AfmoeForCausalLM", "afmoe", {}, ["lm_head"])
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, src, "-o", tmp_path / "out")
    assert code == 2 and "nothing to fix" not in out and len(err.strip().splitlines()) == 1, out + err
    assert "cannot repair" in err and "lm_head" in err, err


def packed(name: str, rows: int, cols: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """ModelOpt's NVFP4 leaves of one linear `name`."""
    weight = (torch.randn(rows, cols, generator=gen) * 0.05).to(torch.bfloat16)
    codes, scale, scale_2 = nvfp4.quantize(weight, nvfp4.global_scale(weight))
    return {f"{name}.weight": codes, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
            f"{name}.input_scale": torch.tensor(0.01)}


@pytest.mark.parametrize("layer,adapter", [(1, 0), (1, 3)])  # export() stores layers 0 and 1
def test_fix_excludes_zamba2_adapters_under_the_prefix_vllm_asks(layer, adapter, tmp_path, capsys):
    """Zamba2's LoRA adapters are stored `...gate_up_proj_adapter_list.I.0` / `.1` (transformers' nn.Sequential);
    vLLM 0.32 refuses their NVFP4 leaves, so fix dequantizes them, and the exclusion must reach the layers vLLM builds:
    zamba2.py hands the quant config `model.feed_forward.gate_up_proj_adapter_list.I.A` / `.B` (the shared block's
    prefix is `model`; the adapter index I, not the layer number, carries over; `.0` is A and `.1` is B). An entry
    naming the checkpoint module is no substring of those, so vLLM built them NVFP4 and its load failed."""
    gen = torch.Generator().manual_seed(0)
    ff = f"model.layers.{layer}.shared_transformer.feed_forward"
    extra = {**packed(f"{ff}.gate_up_proj_adapter_list.{adapter}.0", 32, 32, gen),
             **packed(f"{ff}.gate_up_proj_adapter_list.{adapter}.1", 64, 32, gen)}
    src = export(tmp_path / "src", "Zamba2ForCausalLM", "zamba2", extra, ["lm_head"])
    assert run_captured(capsys, "doctor", "--target", TARGET, src)[0] == 1
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, src, "-o", tmp_path / "out")
    assert code == 0, out + err
    excluded = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert {f"model.feed_forward.gate_up_proj_adapter_list.{adapter}.{ab}" for ab in "AB"} <= set(excluded), excluded
    assert not [e for e in excluded if e.startswith(ff)], excluded
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, "--strict", tmp_path / "out")
    assert code == 0, out + err


def test_fix_writes_the_prefix_of_the_release_it_targets(tmp_path, capsys):
    """The prefix a layer hands the quant config is per release: vLLM 0.28's hy_v3.py builds the shared expert with its
    MoE block's prefix (`model.layers.1.mlp`, so its down_proj is asked as `model.layers.1.mlp.down_proj`); 0.32 names
    it `...mlp.shared_mlp.down_proj`, as the checkpoint does. fix --target vllm==0.28.0 writes 0.28's name (it wrote
    the newest release's, already in the list: a no-op refused while doctor for 0.28 still reported the layer)."""
    shared = "model.layers.1.mlp.shared_mlp.down_proj"
    src = export(tmp_path / "src", "HYV3ForCausalLM", "hy_v3", {f"{shared}.weight": torch.zeros(32, 32, dtype=torch.bfloat16)},
                 ["lm_head", shared])
    assert run_captured(capsys, "doctor", "--target", "vllm==0.32.0", "--strict", src)[0] == 0
    assert run_captured(capsys, "doctor", "--target", "vllm==0.28.0", src)[0] == 1
    code, out, err = run_captured(capsys, "fix", "--target", "vllm==0.28.0", src, "-o", tmp_path / "out")
    assert code == 0, out + err
    excluded = json.loads((tmp_path / "out" / "hf_quant_config.json").read_text())["quantization"]["exclude_modules"]
    assert "model.layers.1.mlp.down_proj" in excluded, excluded
    code, out, err = run_captured(capsys, "doctor", "--target", "vllm==0.28.0", "--strict", tmp_path / "out")
    assert code == 0, out + err
