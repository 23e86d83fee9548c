"""An architecture the target release loads no checkpoint of, whatever its quantization (#26, the profile's `load_refused`).

vLLM 0.28-0.32's dbrx.py looks its fused experts up under `blocks.N.ffn.experts.w13_weight`, a name its FusedMoE no
longer has (vllm-project/vllm#49004); olmo_hybrid.py's conv1d loader indexes with a shard id it never receives
(vllm-project/vllm#55858). The generator records the error from vLLM's own load of transformers' BF16 checkpoint
(tools/vllm_load_refused.py); doctor reports it as one error in vLLM's words, with what to do, and fix refuses in one
line. The vLLM tier checks the shipped fact against vLLM 0.32's real loader on the generated exports
(tests/vllm/test_generated_archs_vs_vllm.py BF16_REFUSED) and that the generator regenerates it
(tests/vllm/test_profiles_vs_vllm.py). The layout below is the tier's healthy DBRX export (tools/vllm_arch_check.py:
transformers' own save_pretrained names, NVFP4 where vLLM builds the layer quantized), one block of it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from repair import arch
from repair.arch.profiled import ReleaseProfile, load_refusal_holds, releases_loading
from repair.targets.profiles import resolve
from tests.conftest import run_captured

DBRX_ERROR = "KeyError: 'blocks.0.ffn.experts.w13_weight'"
OLMO_HYBRID_ERROR = "TypeError: list indices must be integers or slices, not NoneType"
RELEASES = ("vllm==0.28.0", "vllm==0.30.0", "vllm==0.32.0")
ATTN = "transformer.blocks.0.norm_attn_norm.attn"
DBRX = {"architectures": ["DbrxForCausalLM"], "model_type": "dbrx", "d_model": 64, "n_heads": 4, "n_layers": 1,
        "vocab_size": 256, "attn_config": {"kv_n_heads": 2, "clip_qkv": 8, "rope_theta": 500000},
        "ffn_config": {"ffn_hidden_size": 128, "moe_num_experts": 4, "moe_top_k": 2}, "torch_dtype": "bfloat16"}
EXCLUDED = ["lm_head", "transformer.blocks.0.ffn.router.layer", "transformer.blocks.0.norm_attn_norm.norm_1",
            "transformer.blocks.0.norm_attn_norm.norm_2", "transformer.norm_f"]


def nvfp4(module: str, out_features: int, in_features: int) -> dict[str, torch.Tensor]:
    return {f"{module}.weight": torch.full((out_features, in_features // 2), 0x21, dtype=torch.uint8),
            f"{module}.weight_scale": torch.ones(out_features, in_features // 16).to(torch.float8_e4m3fn),
            f"{module}.weight_scale_2": torch.tensor(0.01), f"{module}.input_scale": torch.tensor(0.02)}


def write_dbrx(folder: Path, quantized: bool, config: dict = DBRX) -> Path:
    """One DBRX block under the published names: attention NVFP4 (or BF16), experts, router and norms BF16."""
    folder.mkdir(parents=True)
    bf16 = lambda *shape: torch.full(shape, 0.01, dtype=torch.bfloat16)  # noqa: E731
    tensors = {"transformer.wte.weight": bf16(256, 64), "lm_head.weight": bf16(256, 64), "transformer.norm_f.weight": bf16(64),
               **{f"transformer.blocks.0.ffn.experts.mlp.{w}": bf16(512, 64) for w in ("w1", "v1", "w2")},
               "transformer.blocks.0.ffn.router.layer.weight": bf16(4, 64),
               **{f"transformer.blocks.0.norm_attn_norm.norm_{i}.weight": bf16(64) for i in (1, 2)}}
    for module, out_features in ((f"{ATTN}.Wqkv", 128), (f"{ATTN}.out_proj", 64)):
        tensors |= nvfp4(module, out_features, 64) if quantized else {f"{module}.weight": bf16(out_features, 64)}
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    if quantized:
        quant = {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16, "exclude_modules": EXCLUDED}
        (folder / "hf_quant_config.json").write_text(json.dumps({"producer": {"name": "modelopt", "version": "0.33.0"},
                                                                 "quantization": quant}))
    return folder


@pytest.fixture(scope="module")
def dbrx(tmp_path_factory) -> Path:
    return write_dbrx(tmp_path_factory.mktemp("dbrx") / "nvfp4", quantized=True)


def doctor(capsys, folder: Path, target: str, *more: str) -> tuple[int, list[dict]]:
    code, out, err = run_captured(capsys, "doctor", folder, "--target", target, "--json", *more)
    assert code in (0, 1), err
    return code, json.loads(out)["findings"]


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name,error", [("DbrxForCausalLM", DBRX_ERROR), ("OlmoHybridForCausalLM", OLMO_HYBRID_ERROR)])
def test_every_profiled_release_records_vllms_own_error(name, error, release):
    row = arch.architecture({"architectures": [name]}, resolve(release).release)
    assert row.load_refused is not None and row.load_refused.error == error


def test_only_those_are_recorded_refused():
    """The fact comes from vLLM's load of each architecture, not a list: every other profiled one loads. vLLM 0.28's
    HunYuanVL (a multimodal row since the profiler builds those) takes none of transformers' names: KeyError
    'language_model.embed_tokens.weight'; 0.30 and 0.32 load them."""
    for profile in arch.PROFILES:
        if profile.runtime == "vllm":
            assert profile.load_checked, profile.source
            refused = {n for n, e in profile.entries.items() if "load_refused" in e}
            also = {"HunYuanVLForConditionalGeneration"} if profile.release == (0, 28, 0) else set()
            assert refused == {"DbrxForCausalLM", "OlmoHybridForCausalLM"} | also, profile.source


@pytest.mark.parametrize("release", RELEASES)
def test_doctor_says_it_once_in_vllms_words_with_what_to_do(dbrx, release, capsys):
    code, found = doctor(capsys, dbrx, release, "--tp", "2")
    refused = [f for f in found if f["code"] == "load-refused"]
    assert code == 1 and len(refused) == 1, found
    [f] = refused
    assert (f["severity"], f["subject"], f["runtime_error"], f["ranks"]) == ("error", "DbrxForCausalLM", DBRX_ERROR, [0, 1])
    assert "whatever its" in f["message"] and "quantization" in f["message"]
    assert "none of the profiled vllm 0.28.0, vllm 0.30.0, vllm 0.32.0 loads it" in f["message"], f["message"]


def test_the_text_report_quotes_the_error(dbrx, capsys):
    code, out, err = run_captured(capsys, "doctor", dbrx, "--target", "vllm==0.32.0")
    assert code == 1 and "[load-refused]" in out and DBRX_ERROR in out, out + err


def test_a_release_older_than_every_profile_is_told_nothing(dbrx, capsys):
    """vllm==0.25.0 takes the oldest profile's (0.28's) layer rows, but whether 0.25 loads DBRX nobody recorded."""
    assert not [f for f in doctor(capsys, dbrx, "vllm==0.25.0")[1] if f["code"] == "load-refused"]


def test_an_unquantized_checkpoint_is_refused_too(tmp_path, capsys):
    code, found = doctor(capsys, write_dbrx(tmp_path / "bf16", quantized=False), "vllm==0.32.0")
    assert code == 1 and [f["runtime_error"] for f in found if f["code"] == "load-refused"] == [DBRX_ERROR], found


@pytest.mark.parametrize("target", ["sglang==0.5.23", "bf16"])
def test_other_targets_are_not_told_vllms_fact(dbrx, target, capsys):
    assert not [f for f in doctor(capsys, dbrx, target)[1] if f["code"] == "load-refused"]


def test_another_architecture_is_not_refused(tmp_path, capsys):
    folder = write_dbrx(tmp_path / "llama-named", quantized=False, config=dict(DBRX, architectures=["LlamaForCausalLM"]))
    assert not [f for f in doctor(capsys, folder, "vllm==0.32.0")[1] if f["code"] == "load-refused"]


@pytest.mark.parametrize("targets", ["vllm==0.32.0", "vllm==0.28.0", "vllm==0.32.0,bf16", "sglang==0.5.23,vllm==0.32.0"])
def test_fix_refuses_in_one_line_and_writes_nothing(dbrx, tmp_path, targets, capsys):
    out_dir = tmp_path / "out"
    code, out, err = run_captured(capsys, "fix", dbrx, "-o", out_dir, "--target", targets)
    assert code == 2 and err.count("\n") == 1 and DBRX_ERROR in err and "nothing was written" in err, out + err
    assert "nothing to fix" not in out and not out_dir.exists()


def test_fix_for_another_target_alone_is_not_refused(dbrx, tmp_path, capsys):
    code, out, err = run_captured(capsys, "fix", dbrx, "-o", tmp_path / "out", "--target", "bf16")
    assert code == 0 and DBRX_ERROR not in out + err, out + err


def test_a_release_is_suggested_only_where_its_profile_checked_and_loads_it():
    entries = {"DbrxForCausalLM": {"modules": {}}}
    profiles = (ReleaseProfile("vllm", (0, 26, 0), "vllm-0.26.json", entries, {}),  # not checked: claims nothing
                ReleaseProfile("vllm", (0, 27, 0), "vllm-0.27.json", {"DbrxForCausalLM": {"load_refused": "E: x"}}, {},
                               load_checked=True),
                ReleaseProfile("vllm", (0, 29, 0), "vllm-0.29.json", entries, {}, load_checked=True),
                ReleaseProfile("vllm", (0, 31, 0), "vllm-0.31.json", {}, {}, load_checked=True),  # not profiled
                ReleaseProfile("sglang", (0, 5, 0), "sglang-0.5.json", entries, {}, load_checked=True))
    assert releases_loading(profiles, "vllm", "DbrxForCausalLM") == ("vllm 0.29.0",)


def test_a_release_past_every_profile_gets_a_note_not_a_refusal(dbrx, tmp_path, capsys):
    """vllm==0.33.0 takes 0.32's rows, but a later release may have fixed its load_weights (the issues name the
    fix): the newest profile's failure is said as a note; doctor exits 0 and `fix --target` is not refused for it."""
    code, found = run_captured(capsys, "doctor", dbrx, "--target", "vllm==0.33.0", "--json")[:2]
    report = json.loads(found)
    assert not [f for f in report["findings"] if f["code"] == "load-refused"] and not report["runtime_stops_at"], report
    [note] = [n for n in report["notes"] if n["code"] == "load-refused"]
    assert DBRX_ERROR in note["message"] and code == 0, note
    assert "vllm 0.32.0" in note["message"] and "vllm==0.33.0" in note["message"], note["message"]
    code, out, err = run_captured(capsys, "fix", dbrx, "-o", tmp_path / "fixed", "--target", "vllm==0.33.0", "--dry-run")
    assert code == 0 and "load_weights" not in err, err


def test_a_release_between_profiles_is_refused_when_the_newer_profile_refuses_too(dbrx, capsys):
    """vllm==0.31.0 takes 0.30's rows; 0.32 fails the same way, so 0.31 does too (a fix is not undone)."""
    code, found = doctor(capsys, dbrx, "vllm==0.31.0")
    [f] = [f for f in found if f["code"] == "load-refused"]
    assert code == 1 and f["severity"] == "error" and f["runtime_error"] == DBRX_ERROR, f


def test_between_profiles_a_newer_profile_that_loads_it_makes_a_note():
    """When the next profiled release loads it, the target's release may be the one that fixed it: a note."""
    entries = {"DbrxForCausalLM": {"load_refused": "KeyError: 'x'"}}
    profiles = (ReleaseProfile("vllm", (0, 30, 0), "vllm-0.30.json", entries, {}, load_checked=True),
                ReleaseProfile("vllm", (0, 32, 0), "vllm-0.32.json", {"DbrxForCausalLM": {}}, {}, load_checked=True))
    assert not load_refusal_holds(profiles, "vllm", (0, 31, 0), "DbrxForCausalLM")
    assert load_refusal_holds(profiles, "vllm", (0, 30, 0), "DbrxForCausalLM")
    assert load_refusal_holds(profiles, "vllm", (0, 29, 0), "DbrxForCausalLM")


@pytest.mark.parametrize("dry_run", [True, False])
def test_fix_for_a_release_past_every_profile_says_the_load_failure_it_does_not_refuse(dbrx, tmp_path, capsys, dry_run):
    """`fix --target vllm==0.33.0` is not refused for DBRX, but it must not be silent where it used to refuse: a user who
    runs only fix learns that 0.32's loader fails on every DBRX checkpoint and to check that 0.33 loads it (doctor's
    note, said once), whether the plan changes nothing (this export) or writes a copy (with bf16 too, or per rank)."""
    for target, tp in (("vllm==0.33.0", ()), ("vllm==0.33.0,bf16", ()), ("vllm==0.33.0", ("--tp", "2"))):
        out = tmp_path / f"fixed-{dry_run}-{target.replace(',', '-')}-{len(tp)}"
        code, said, err = run_captured(capsys, "fix", dbrx, "-o", out, "--target", target, *tp, *(["--dry-run"] if dry_run else []))
        assert code == 0, err
        assert said.count(DBRX_ERROR) == 1 and "check that vllm==0.33.0 loads it" in said, said
        assert "note for vllm==0.33.0: [load-refused] DbrxForCausalLM" in said, said
