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
    src = export(tmp_path / "src", arch, model_type, experts, ["lm_head", *experts])
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


def test_leafless_experts_of_raw_float8_codes_are_never_excluded(tmp_path, capsys):
    """Excluding the FusedMoE prefix makes vLLM build the experts BF16: right for BF16 tensors, garbage for float8 codes
    stored with no scale. Those are refused in one line, never written with an exclusion."""
    experts = {f"model.layers.{n}.feed_forward.experts.{p}": torch.zeros(4, 64, 32).to(torch.float8_e4m3fn)
               for n in range(2) for p in ("gate_up_proj", "down_proj")}
    src = export(tmp_path / "src", "Llama4ForCausalLM", "llama4_text", experts, ["lm_head", *experts])
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
