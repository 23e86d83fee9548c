"""What the two doctor-vs-vLLM test files share: the fixture folders, the probe configurations, doctor
run in process, and how doctor's messages are compared with vLLM's (see test_doctor_vs_vllm.py's
docstring for the rules). The session fixtures `folders` and `probe` are in conftest.py, so both
files use one set of folders and one batch of vLLM processes.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import torch as safetensors_torch

from repair.cli import main as ckpt_repair
from repair.codec import nvfp4
from repair.demo.examples import GEMMA4_31B, TINY, write_assistant
from repair.targets.vllm_loader import vllm_name

from .probe import Run, innermost_function, needs_legacy

TARGET = {"installed": "vllm==0.32.0", "legacy": "vllm==0.22.1"}
SEED_TP1 = "RuntimeError: start (0) + length (8192) exceeds dimension size (4096)."
SEED_TP2 = "RuntimeError: start (4096) + length (4096) exceeds dimension size (4096)."
DOWN0 = "model.layers.0.mlp.down_proj"
Q0 = "model.layers.0.self_attn.q_proj"
NOT_INITIALISED = "ValueError: Following weights were not initialized from checkpoint: "
# doctor's findings for modules whose NVFP4 parameters no checkpoint tensor fills
UNINITIALISED_CODES = ("missing-input-scale", "missing-weight-scale", "missing-scale-2", "silent-garbage")
NAN_CODES = ("silent-garbage", "missing-weight-scale", "block-scales")  # what trips vLLM 0.32's NaN check
NAN_CHECK = ("RuntimeError: NVFP4 weight_scale for layer 'row_parallel_linear' was never loaded (still NaN). "
             "The checkpoint likely stores this layer as BF16 (not FP4). Fix: pass quant_config=None when "
             "constructing this layer, or add it to the quantization ignore list.")


# --------------------------------------------------------------------------------------------------------
# the CLI, in process
# --------------------------------------------------------------------------------------------------------
def cli(*args) -> tuple[int, str]:
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out):
        try:
            ckpt_repair([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code or 0
    return code, out.getvalue()


_DOCTOR: dict = {}


def doctor(folder: Path, behaviour: str, tp: int = 1) -> dict:
    key = (str(folder), behaviour, tp)
    if key not in _DOCTOR:
        code, out = cli("doctor", folder, "--target", TARGET[behaviour], "--tp", tp, "--json")
        assert code in (0, 1), out
        _DOCTOR[key] = json.loads(out)
    return _DOCTOR[key]


def stop_at(report: dict, rank: int) -> dict | None:
    return {s["rank"]: s for s in report["runtime_stops_at"]}.get(rank)


def findings(report: dict, code: str) -> dict[str, dict]:
    return {f["subject"]: f for f in report["findings"] if f["code"] == code}


def fix(src: Path, out: Path, target: str) -> Path:
    code, text = cli("fix", src, "-o", out, "--target", target, "--quiet")
    assert code == 0, text
    return out


# --------------------------------------------------------------------------------------------------------
# fixture folders
# --------------------------------------------------------------------------------------------------------
def variant(src: Path, dst: Path, tensors=None, config=None, drop_quantization: bool = False) -> Path:
    """Copy a one-file checkpoint, editing its tensors / config.json through callbacks."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("repair_report.json"))
    if tensors:
        state = safetensors_torch.load_file(dst / "model.safetensors")
        tensors(state)
        safetensors_torch.save_file(state, dst / "model.safetensors", metadata={"format": "pt"})
    _edit_config(dst, config, drop_quantization)
    return dst


def linked_variant(src: Path, dst: Path, config=None, drop_quantization: bool = False) -> Path:
    """A folder sharing `src`'s shards (31B: ~650 MB written once) with its own config. Hard links, not the
    smoke tests' symlinks: ckpt-repair refuses symlinks that leave the checkpoint folder."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name.endswith(".safetensors") or f.name == "model.safetensors.index.json":
            try:
                os.link(f, dst / f.name)
            except OSError:  # another filesystem
                shutil.copy2(f, dst / f.name)
        elif f.name.endswith(".json") and f.name != "repair_report.json":
            shutil.copy2(f, dst / f.name)
    _edit_config(dst, config, drop_quantization)
    return dst


def _edit_config(folder: Path, config, drop_quantization: bool) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    if config:
        config(cfg)
    if drop_quantization:
        cfg.pop("quantization_config", None)
        (folder / "hf_quant_config.json").unlink(missing_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))


def exclude_handshake(cfg: dict) -> None:
    """The half-done repair: the config excludes pre/post_projection, the tensors stay packed."""
    cfg["quantization_config"]["ignore"] += ["pre_projection", "post_projection"]


def setter(name: str, make):
    return lambda state: state.__setitem__(name, make(state))


def bf16_down0(state: dict) -> None:
    """layer-0 down_proj stored BF16 while the config declares it NVFP4 (no scales)."""
    for leaf in ("weight_scale", "weight_scale_2", "input_scale"):
        del state[f"{DOWN0}.{leaf}"]
    gen = torch.Generator().manual_seed(7)
    state[f"{DOWN0}.weight"] = (0.05 * torch.randn(64, 128, generator=gen)).to(torch.bfloat16)


def pack_down0(state: dict) -> None:
    """layer-0 down_proj packed to NVFP4 (with its scales) in an otherwise BF16 checkpoint."""
    q, s, s2 = nvfp4.quantize(state[f"{DOWN0}.weight"])
    state.update({f"{DOWN0}.weight": q, f"{DOWN0}.weight_scale": s, f"{DOWN0}.weight_scale_2": s2})


def nan_block_scale(state: dict) -> None:
    """One NaN (0x7F) in layer-0 down_proj's fp8 block scales (rank 0's slice at TP=2)."""
    raw = state[f"{DOWN0}.weight_scale"].view(torch.uint8).clone()
    raw[0, 0] = 0x7F
    state[f"{DOWN0}.weight_scale"] = raw.view(torch.float8_e4m3fn)


LEFTOVER = setter("pre_projection.weight_scale", lambda s: torch.ones(64, 12).to(torch.float8_e4m3fn))


def build_folders(root: Path, broken_export: Path) -> dict[str, Path]:
    """Every fixture folder, by name (tests/vllm/conftest.py `folders`, built once per session)."""
    f: dict[str, Path] = {}
    # tiny, project codec: the ModelOpt-style buggy export, the correct one, and one defect per folder
    f["broken"] = write_assistant(root / "broken", TINY, broken=True)
    f["broken_noinput"] = write_assistant(root / "broken_noinput", TINY, broken=True, input_scales=False)
    f["healthy"] = healthy = write_assistant(root / "healthy", TINY, broken=False)
    f["noinput"] = write_assistant(root / "noinput", TINY, broken=False, input_scales=False)
    f["excluded_packed"] = variant(f["broken"], root / "excluded_packed", config=exclude_handshake)
    f["excluded_packed_noinput"] = variant(f["broken_noinput"], root / "excluded_packed_noinput",
                                           config=exclude_handshake)
    f["undeclared"] = variant(f["broken"], root / "undeclared", drop_quantization=True)
    f["undeclared_noinput"] = variant(f["broken_noinput"], root / "undeclared_noinput", drop_quantization=True)
    f["leftover"] = variant(healthy, root / "leftover", tensors=LEFTOVER)
    f["stray_on_nvfp4"] = variant(healthy, root / "stray_on_nvfp4",
                                  tensors=setter(f"{DOWN0}.weight_zero", lambda s: torch.ones(1)))
    f["scale_shape_row"] = variant(healthy, root / "scale_shape_row", tensors=setter(
        f"{DOWN0}.weight_scale", lambda s: s[f"{DOWN0}.weight_scale"][:, :4].contiguous()))
    f["scale_shape_col"] = variant(healthy, root / "scale_shape_col", tensors=setter(
        f"{Q0}.weight_scale", lambda s: s[f"{Q0}.weight_scale"][:32].contiguous()))
    f["scale2_shape"] = variant(healthy, root / "scale2_shape",
                                tensors=setter(f"{DOWN0}.weight_scale_2", lambda s: torch.ones(2)))
    f["siblings_scale2"] = variant(healthy, root / "siblings_scale2", tensors=setter(
        "model.layers.0.mlp.up_proj.weight_scale_2", lambda s: s["model.layers.0.mlp.up_proj.weight_scale_2"] * 2))
    f["nan_scale2"] = variant(healthy, root / "nan_scale2",
                              tensors=setter(f"{DOWN0}.weight_scale_2", lambda s: torch.tensor(float("nan"))))
    f["bf16_declared_nvfp4"] = variant(healthy, root / "bf16_declared_nvfp4", tensors=bf16_down0)
    f["no_weight_scale"] = variant(healthy, root / "no_weight_scale", tensors=lambda s: s.pop(f"{DOWN0}.weight_scale"))
    f["no_weight_scale_2"] = variant(healthy, root / "no_weight_scale_2",
                                     tensors=lambda s: s.pop(f"{DOWN0}.weight_scale_2"))
    f["nan_block_scale"] = variant(healthy, root / "nan_block_scale", tensors=nan_block_scale)
    # the real buggy ModelOpt export (tiny) and its repairs
    f["mo_broken"] = broken_export
    f["mo_fix_025"] = fix(broken_export, root / "mo_fix_025", "vllm==0.25.0")
    f["mo_fix_022"] = fix(broken_export, root / "mo_fix_022", "vllm==0.22.1")
    f["mo_fix_bf16"] = fix(broken_export, root / "mo_fix_bf16", "bf16")
    f["leftover_bf16"] = variant(f["mo_fix_bf16"], root / "leftover_bf16", tensors=LEFTOVER)
    f["packed_down0_in_bf16"] = variant(f["mo_fix_bf16"], root / "packed_down0_in_bf16", tensors=pack_down0)
    # the real 31B assistant shapes: embed_tokens (512 MB) in its own shard
    f["r31_broken"] = write_assistant(root / "r31_broken", GEMMA4_31B, broken=True, shards=[["model.embed_tokens"]])
    f["r31_excluded_packed"] = linked_variant(f["r31_broken"], root / "r31_excluded_packed", config=exclude_handshake)
    f["r31_undeclared"] = linked_variant(f["r31_broken"], root / "r31_undeclared", drop_quantization=True)
    f["r31_fix_025"] = fix(f["r31_broken"], root / "r31_fix_025", "vllm==0.25.0")
    f["r31_fix_022"] = fix(f["r31_broken"], root / "r31_fix_022", "vllm==0.22.1")
    return f



# --------------------------------------------------------------------------------------------------------
# probe configurations: each runs ONE vLLM process over its folders
# --------------------------------------------------------------------------------------------------------
TINY_DEFECTS = ["broken", "broken_noinput", "healthy", "noinput", "excluded_packed", "excluded_packed_noinput",
                "undeclared", "undeclared_noinput", "leftover", "stray_on_nvfp4", "scale_shape_row",
                "scale_shape_col", "scale2_shape", "siblings_scale2", "nan_scale2", "bf16_declared_nvfp4",
                "no_weight_scale", "no_weight_scale_2", "nan_block_scale"]
R31_INSTALLED = ["r31_broken", "r31_excluded_packed", "r31_undeclared", "r31_fix_025"]
RUNS = {
    Run("installed", 1, 0): TINY_DEFECTS + ["mo_broken", "mo_fix_025", "leftover_bf16"] + R31_INSTALLED,
    Run("installed", 2, 1): TINY_DEFECTS + ["mo_broken", "mo_fix_025", "leftover_bf16"] + R31_INSTALLED,
    Run("installed", 2, 0): ["excluded_packed_noinput", "undeclared_noinput", "scale_shape_row", "scale_shape_col"],
    Run("installed", 1, 0, weights_track=False): ["noinput", "broken_noinput", "bf16_declared_nvfp4",
                                                  "no_weight_scale", "no_weight_scale_2", "nan_block_scale"],
    Run("installed", 2, 1, weights_track=False): ["noinput", "bf16_declared_nvfp4"],
    Run("legacy", 1, 0): ["broken", "healthy", "excluded_packed", "undeclared_noinput", "bf16_declared_nvfp4",
                          "mo_broken", "mo_fix_025", "mo_fix_022", "mo_fix_bf16", "leftover_bf16",
                          "packed_down0_in_bf16", "r31_broken", "r31_fix_022"],
    Run("legacy", 2, 1): ["broken", "mo_broken", "mo_fix_022", "mo_fix_bf16", "packed_down0_in_bf16",
                          "r31_broken", "r31_fix_022"],
    Run("legacy", 2, 0): ["broken", "bf16_declared_nvfp4", "mo_broken", "mo_fix_022", "mo_fix_bf16",
                          "packed_down0_in_bf16", "r31_broken"],
}



def marks_of(run: Run):
    return [needs_legacy] if run.behaviour == "legacy" else []


def param_id(name: str, run: Run) -> str:
    return f"{name}-{run.behaviour}-tp{run.tp_size}r{run.tp_rank}" + ("" if run.weights_track else "-notrack")


def cases(runs=RUNS, track=True, names=None):
    return [pytest.param(name, run, id=param_id(name, run), marks=marks_of(run))
            for run, folder_names in runs.items() if run.weights_track == track
            for name in folder_names if names is None or name in names]


# --------------------------------------------------------------------------------------------------------
# comparing doctor's message with vLLM's
# --------------------------------------------------------------------------------------------------------
SET_TAIL = re.compile(r"^(?P<head>.*?)(?P<set>\{'[^{}]*'\})$", re.S)
NAMED_CHECK = re.compile(r"^AssertionError: \(no message\) shape check in (?:\w+\.)*(?P<fn>\w+) fails")


def vllm_message(res: dict) -> str:
    return f"{res['error_type']}: {res['error']}"


def same_message(predicted: str, actual: str) -> bool:
    if predicted == actual:
        return True
    p, a = SET_TAIL.match(predicted), SET_TAIL.match(actual)
    return bool(p and a) and p["head"] == a["head"] and ast.literal_eval(p["set"]) == ast.literal_eval(a["set"])


def uninitialised(res: dict) -> set[str]:
    """The parameter names of vLLM's weights-tracking error."""
    return ast.literal_eval(vllm_message(res)[len(NOT_INITIALISED):])


def vllm_module(subject: str) -> str:
    """doctor's module name -> the vLLM module it loads into (gate/up -> gate_up_proj, model. prefixes)."""
    return vllm_name(f"{subject}.weight").rpartition(".")[0]


def assert_doctor_matches(report: dict, res: dict, rank: int) -> None:
    stop = stop_at(report, rank)
    if res["ok"]:
        assert stop is None, f"doctor predicts rank {rank} stops at {stop['tensor']} with {stop['error']!r}; vLLM loads"
        return
    actual = vllm_message(res)
    if actual.startswith(NOT_INITIALISED):
        # vLLM's missing-weights check (off by default for quantized drafts): doctor predicts a silent load,
        # and flags every module vLLM names
        assert stop is None, f"vLLM only misses weights ({actual}); doctor predicts a stop: {stop}"
        flagged = {vllm_module(s) for code in UNINITIALISED_CODES for s in findings(report, code)}
        named = {p.rpartition(".")[0] for p in uninitialised(res)}
        assert named <= flagged, f"vLLM leaves {sorted(named - flagged)} uninitialised; doctor flags {sorted(flagged)}"
        return
    if actual == NAN_CHECK:
        # documented difference (test_post_load_nan_check_of_vllm_032_is_a_documented_difference): vLLM 0.32's
        # post-load NaN check is not predicted as a stop; doctor must still report the module as an error
        assert stop is None and {f["code"] for f in report["findings"] if f["severity"] == "error"} & set(NAN_CODES)
        return
    assert stop is not None, f"vLLM raises {actual!r} on rank {rank}; doctor predicts it loads"
    if res["error_type"] == "AssertionError" and res["error"] == "":
        check = NAMED_CHECK.match(stop["error"])
        assert check, f"vLLM raises a bare AssertionError; doctor predicts {stop['error']!r}"
        assert check["fn"] == innermost_function(res.get("traceback")), (
            f"doctor names {check['fn']}; vLLM's assert is in {innermost_function(res.get('traceback'))}\n"
            f"{res.get('traceback')}")
        return
    assert same_message(stop["error"], actual), f"doctor: {stop['error']!r}\nvLLM:   {actual!r}"


