"""Attacks on the merged layer-name facts (#26, #28): entries a careless user or a hostile config writes under the
names a runtime release asks rather than the checkpoint's. fix then doctor --strict is clean for every target, or fix
refuses in one line (exit 2); never exit 3 (our own self-check failing) on such input."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import run_captured
from tests.sglang.reports import edit_json, gemma4_vision_linear

FUSED = "model.vision_tower.encoder.layers.0.self_attn.qkv_proj"


def vision_linear_with_sglangs_fused_name(folder: Path) -> Path:
    """sglang#24927's `.linear` layout, plus the fused layer SGLang 0.5.23 asks about (`...self_attn.qkv_proj`), as a
    user who read SGLang's log would add it: SGLang excludes its fused vision q/k/v by that entry."""
    gemma4_vision_linear(folder)
    edit_json(folder / "hf_quant_config.json", lambda d: d["quantization"]["exclude_modules"].append(FUSED))
    return folder


def test_an_entry_naming_sglangs_fused_layer_is_not_unused(capsys, tmp_path):
    src = vision_linear_with_sglangs_fused_name(tmp_path / "src")
    code, out, err = run_captured(capsys, "doctor", src, "--target", "sglang==0.5.23")
    assert f"exclusion {FUSED!r} matches no module" not in out, out


def test_fix_keeps_the_entry_sglang_reads_and_its_output_is_clean(capsys, tmp_path):
    """The entry is the one SGLang's fused qkv_proj is excluded by; fix had removed it as 'matching no module', so
    SGLang built the layer NVFP4 over the BF16 shards and fix's own check exited 3."""
    src = vision_linear_with_sglangs_fused_name(tmp_path / "src")
    for i, targets in enumerate(("sglang==0.5.23", "vllm==0.28.0,vllm==0.32.0,sglang==0.5.23,trtllm==1.2.0")):
        out_dir = tmp_path / f"out{i}"
        code, out, err = run_captured(capsys, "fix", src, "-o", out_dir, "--target", targets)
        assert code == 0, out + err
        for target in targets.split(","):
            code, out, err = run_captured(capsys, "doctor", out_dir, "--target", target, "--strict")
            assert code == 0, (target, out, err)


def vision_q_stored_twice(folder: Path) -> Path:
    """The layout where SGLang must have k/v dequantized (q BF16 and excluded as stored), plus a stored NVFP4 module
    named `...self_attn.q_proj`: the very name SGLang asks the `.linear` q under (layer_names), so an entry for the BF16
    q would exclude this quantized one too."""
    import torch
    from safetensors.torch import load_file, save_file

    from repair.codec import nvfp4
    from tests.sglang.reports import gemma4_vision_k_v_packed

    gemma4_vision_k_v_packed(folder)
    tensors = load_file(folder / "model.safetensors")
    module = "model.vision_tower.encoder.layers.0.self_attn.q_proj"
    packed, scales, scale_2 = nvfp4.quantize(tensors[module + ".linear.weight"].float())
    tensors |= {module + ".weight": packed, module + ".weight_scale": scales, module + ".weight_scale_2": scale_2,
                module + ".input_scale": torch.tensor(1.0)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_an_entry_that_would_name_another_stored_module_is_refused_in_one_line(capsys, tmp_path):
    src = vision_q_stored_twice(tmp_path / "src")
    for i, targets in enumerate(("sglang==0.5.23", "vllm==0.32.0,sglang==0.5.23")):
        code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / f"out{i}", "--target", targets)
        assert code == 2 and not (tmp_path / f"out{i}").exists(), out + err
        assert len(err.strip().splitlines()) == 1 and "model.vision_tower.encoder.layers.0.self_attn.q_proj" in err, err


def vision_k_elsewhere(folder: Path, layer: str | None) -> Path:
    """The k/v-packed layout with vision layer 0's k_proj moved to another layer number (`layer`; None: not stored):
    SGLang 0.5.23 builds layer 0's fused qkv_proj from q, k and v, and asks its exclusions about each shard's name."""
    from safetensors.torch import load_file, save_file

    from tests.sglang.reports import gemma4_vision_k_v_packed

    gemma4_vision_k_v_packed(folder)
    old = "model.vision_tower.encoder.layers.0.self_attn.k_proj.linear."
    tensors = {(k if not k.startswith(old) else None if layer is None else k.replace("layers.0", f"layers.{layer}")): v
               for k, v in load_file(folder / "model.safetensors").items()}
    tensors.pop(None, None)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.mark.parametrize("layer", [None, "99999999999999999999999", "{0}", "0\n"])
def test_a_fused_layer_missing_a_shard_is_refused_in_one_line(capsys, tmp_path, layer):
    """fix dequantized v (q is BF16) and excluded q and v under SGLang's shard names, but SGLang also asks about
    the k shard, which nothing names: it built the fused layer NVFP4 and fix's self-check exited 3. No entry makes a
    layer whole whose shard the checkpoint lacks, so fix refuses, naming the shard."""
    src = vision_k_elsewhere(tmp_path / "src", layer)
    for i, targets in enumerate(("sglang==0.5.23", "vllm==0.32.0,sglang==0.5.23")):
        code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / f"out{i}", "--target", targets)
        assert code == 2 and not (tmp_path / f"out{i}").exists(), out + err
        assert len(err.strip().splitlines()) == 1 and "model.vision_tower.encoder.layers.0.self_attn.k_proj" in err, err
