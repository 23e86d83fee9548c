"""Routed experts' gate/up weight_scale_2: the runtime builds each expert's gate (w1) and up (w3) as one w13 parameter
and keeps one global scale per expert, so an expert whose two differ computes one half wrong, silently (vLLM 0.28-0.32
keep the gate's: modelopt.py ModelOptNvFp4FusedMoE.process_weights_after_loading). doctor checked siblings' scales on
dense fused layers only (`family.scale_groups` skips `.experts.`); the release's data now says what it keeps
(`experts_gate_up_scale_2`), and doctor reports every such expert, grouped. ModelOpt's export gives an expert's pair
one scale (formats/shared_scale.py), so fix requantizes the pair with --original, or refuses in one line."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from repair.arch.profiled import read_profiles
from repair.codec import nvfp4
from tests.conftest import run_captured

TARGET = "vllm==0.32.0"
MOE = "model.layers.0.mlp.experts"
WARNING = "w1_weight_scale_2 must match w3_weight_scale_2. Accuracy may be affected."


def qwen3_moe(root: Path, experts: int, broken: tuple[int, ...], original: Path | None = None, factor: float = 2.0) -> Path:
    """A tiny ModelOpt-like NVFP4 Qwen3-MoE layer 0: `experts` routed experts, each gate/up pair sharing one global
    scale as ModelOpt's export gives it; the experts in `broken` have their up_proj packed with `factor` times it. With
    `original`, the BF16 weights are written there too (an --original for fix)."""
    gen = torch.Generator().manual_seed(0)
    tensors = {"model.embed_tokens.weight": torch.randn(64, 32, generator=gen).to(torch.bfloat16),
               "lm_head.weight": torch.randn(64, 32, generator=gen).to(torch.bfloat16),
               "model.layers.0.mlp.gate.weight": torch.randn(experts, 32, generator=gen).to(torch.bfloat16)}
    originals = dict(tensors)
    for e in range(experts):
        weights = {p: (torch.randn(32, 32, generator=gen) * 0.05).to(torch.bfloat16) for p in ("gate_proj", "up_proj", "down_proj")}
        shared = nvfp4.global_scale(torch.stack([weights["gate_proj"], weights["up_proj"]]))
        for p, w in weights.items():
            name = f"{MOE}.{e}.{p}"
            own = shared * factor if p == "up_proj" and e in broken else shared  # a broken up: packed with another scale
            packed, scale, scale_2 = nvfp4.quantize(w, own.clone() if p != "down_proj" else nvfp4.global_scale(w))
            tensors.update({f"{name}.weight": packed, f"{name}.weight_scale": scale, f"{name}.weight_scale_2": scale_2,
                            f"{name}.input_scale": torch.tensor(0.01)})
            originals[f"{name}.weight"] = w
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": experts,
              "num_hidden_layers": 1, "hidden_size": 32, "moe_intermediate_size": 32, "vocab_size": 64}
    for folder, state in ((root, tensors), (original, originals)):
        if folder is None:
            continue
        folder.mkdir(parents=True)
        save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
        (folder / "config.json").write_text(json.dumps(config))
    (root / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.47.0"},
        "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                         "exclude_modules": ["lm_head", "model.layers.0.mlp.gate"]}}))
    return root


def expert_findings(capsys, src: Path, *args: str) -> dict[str, dict]:
    code, text, err = run_captured(capsys, "doctor", src, "--target", TARGET, "--json", *args)
    return {f["subject"]: f for f in json.loads(text)["findings"] if f["code"] == "experts-gate-up-scale-2"}


def test_each_vllm_release_records_that_it_keeps_the_gates_scale():
    """The fact is the release's data, per quant method (tools/vllm_expert_scales.py read it from each method's source)."""
    facts = {p.label: p.experts_gate_up_scale_2 for p in read_profiles() if p.runtime == "vllm"}
    assert facts and all(f["modelopt_fp4"].get("keeps") == "gate" and f["modelopt_fp4"].get("log") == WARNING
                         for f in facts.values()), facts
    # the mixed config's experts (same class) and compressed-tensors' own method: read in every release (0.30's from
    # its rebuilt venv; its first data had been read from its modelopt.py alone)
    for label in ("vllm 0.28.0", "vllm 0.30.0", "vllm 0.32.0"):
        assert facts[label]["modelopt_mixed"] == facts[label]["modelopt_fp4"], facts[label]
        ct = facts[label]["compressed-tensors"]
        assert ct["keeps"] == "gate" and ct["log"].startswith("w1_weight_global_scale must match"), ct


def test_an_expert_whose_up_scale_differs_is_an_error_naming_the_scale_vllm_keeps(capsys, tmp_path):
    src = qwen3_moe(tmp_path / "src", 4, broken=(2,))
    found = expert_findings(capsys, src)
    assert list(found) == [f"{MOE}.2"], found
    (f,) = found.values()
    assert f["severity"] == "error"
    assert "gate_proj and up_proj" in f["message"] and "keeps the gate's (w1)" in f["message"]
    assert WARNING in f["message"] and "the up half computes values off by the ratio" in f["message"]
    assert expert_findings(capsys, qwen3_moe(tmp_path / "healthy", 4, broken=())) == {}


def test_scales_within_the_runtimes_own_tolerance_are_not_reported(capsys, tmp_path):
    """vLLM compares the pair with torch.allclose (rtol 1e-5, atol 1e-8) and logs nothing within it; the kept scale is
    then off by at most 1e-5 relative, far below NVFP4's own error: no finding (found by the attacker review: a 1-ulp
    difference was an error quoting a log vLLM never writes)."""
    from safetensors.torch import load_file

    src = qwen3_moe(tmp_path / "src", 4, broken=(1,), factor=1 + 4e-6)
    stored = load_file(src / "model.safetensors")
    gate, up = (stored[f"{MOE}.1.{p}.weight_scale_2"] for p in ("gate_proj", "up_proj"))
    assert not torch.equal(gate, up) and torch.allclose(gate, up)  # the premise: different, yet close for vLLM
    assert expert_findings(capsys, src) == {}
    far = qwen3_moe(tmp_path / "far", 4, broken=(1,), factor=1.01)
    assert list(expert_findings(capsys, far)) == [f"{MOE}.1"]


def test_128_broken_experts_read_in_a_few_lines(capsys, tmp_path):
    src = qwen3_moe(tmp_path / "src", 128, broken=tuple(range(128)))
    assert len(expert_findings(capsys, src)) == 128
    code, text, err = run_captured(capsys, "doctor", src, "--target", TARGET)
    lines = [line for line in text.splitlines() if "experts-gate-up-scale-2" in line]
    assert code == 1 and len(lines) == 1 and "128" in lines[0], text
    assert len([line for line in text.splitlines() if "model.layers.0.mlp.experts." in line]) <= 2, text
    assert "more pattern" not in lines[0], lines  # one compact pattern names the 128 experts


def test_fix_refuses_in_one_line_without_the_original(capsys, tmp_path):
    src = qwen3_moe(tmp_path / "src", 4, broken=(1,))
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", TARGET)
    assert code == 2 and not (tmp_path / "out").exists(), (out, err)
    assert f"{MOE}.1" in err and "--original" in err and len(err.strip().splitlines()) == 1, err


def test_fix_requantizes_the_pair_from_the_original_and_the_output_passes_doctor(capsys, tmp_path):
    src = qwen3_moe(tmp_path / "src", 4, broken=(1,), original=tmp_path / "orig")
    out = tmp_path / "out"
    code, text, err = run_captured(capsys, "fix", src, "-o", out, "--target", TARGET, "--original", tmp_path / "orig",
                                   "--requantize", f"{MOE}.1.up_proj")
    assert code == 0, (text, err)
    assert expert_findings(capsys, out, "--strict") == {}
    from safetensors.torch import load_file

    written = load_file(out / "model.safetensors")
    gate, up = (written[f"{MOE}.1.{p}.weight_scale_2"] for p in ("gate_proj", "up_proj"))
    assert torch.equal(gate, up)


def compressed_tensors_moe(root: Path, broken: tuple[int, ...]) -> Path:
    """The ModelOpt-like fixture converted by compressed-tensors' own converter (tools/ct_export.py): each expert's
    global scale stored as weight_global_scale (1/weight_scale_2), the config `quant_method: compressed-tensors`."""
    src = qwen3_moe(root / "modelopt", 4, broken=broken)
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                     "ignore": ["lm_head", "model.layers.0.mlp.gate"]}
    (src / "config.json").write_text(json.dumps(config))
    from tools.ct_export import convert_modelopt

    out = convert_modelopt(src, root / "ct")
    (out / "hf_quant_config.json").unlink(missing_ok=True)  # the converter copies it; a compressed-tensors export has none
    return out


def test_a_compressed_tensors_expert_is_told_in_its_own_method_s_words(capsys, tmp_path):
    """vLLM builds a compressed-tensors NVFP4 MoE with CompressedTensorsW4A4Nvfp4MoEMethod, not ModelOpt's method: it
    keeps the gate's weight_global_scale too, and logs its own warning (compressed_tensors_moe_w4a4_nvfp4.py
    process_weights_after_loading); the checkpoint stores weight_global_scale, and compressed-tensors cannot be
    requantized (fix refuses it), so the finding must not quote ModelOpt's log nor advise --requantize."""
    src = compressed_tensors_moe(tmp_path, broken=(1,))
    (f,) = expert_findings(capsys, src).values()
    assert f["severity"] == "error" and f["subject"] == f"{MOE}.1", f
    assert "w1_weight_global_scale must match w3_weight_global_scale" in f["message"], f["message"]
    assert WARNING not in f["message"] and "weight_global_scale" in f["message"], f["message"]
    assert "--requantize" not in f["message"], f["message"]
    code, out, err = run_captured(capsys, "fix", src, "-o", tmp_path / "out", "--target", TARGET)
    assert code == 2 and not (tmp_path / "out").exists() and len(err.strip().splitlines()) == 1, (out, err)


def test_a_weight_only_nvfp4_expert_is_checked_too(capsys, tmp_path):
    """W4A16_NVFP4 experts are built by the same ModelOptNvFp4FusedMoE (vLLM 0.32 modelopt.py: use_a16 only picks the
    kernel), whose process_weights_after_loading keeps column 0 before any kernel choice: the up half is as wrong."""
    src = qwen3_moe(tmp_path / "src", 4, broken=(3,))
    quant = json.loads((src / "hf_quant_config.json").read_text())
    quant["quantization"]["quant_algo"] = "W4A16_NVFP4"
    (src / "hf_quant_config.json").write_text(json.dumps(quant))
    found = expert_findings(capsys, src)
    assert list(found) == [f"{MOE}.3"] and found[f"{MOE}.3"]["severity"] == "error", found
