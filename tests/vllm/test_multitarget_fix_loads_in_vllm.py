"""`fix --target vllm==0.32.0,sglang==0.5.23` on the layouts of issue #28 gives an output vLLM 0.32's real loader
loads (tools/vllm_load.py: `vllm serve`'s config reading, the architecture's own model class and load_weights on CPU,
every parameter tracked): the vLLM half of "an output both consumers accept" (the SGLang tier loads the same outputs
in SGLang's model code: tests/sglang/test_fix_loads_in_sglang.py).

Layouts, built as the SGLang tier builds them:
  - tests/sglang/defects.py: the real Qwen3-32B fixture with a packed tensor in a layer SGLang builds BF16, or a BF16
    one where it builds NVFP4, per loader (row-parallel, merged-column, QKV);
  - every real-config fixture (tests/sglang/fixtures.py) `doctor --target sglang==0.5.23` finds SGLang refusing or
    mis-loading (the SGLang tier shows doctor's per-layer prediction equals SGLang's own on each);
  - the published reports of #28 (tests/sglang/reports.py, shared with the SGLang tier): Gemma-4's vision tower excluded by `.linear` names (sglang#24927), GLM's
    `*.self_attn.q_proj` excluded while SGLang fuses qkv_proj (sglang#36596, on the real GLM-4 MoE export and on
    Qwen3-32B), lm_head excluded but stored with its NVFP4 scales (vllm#45102).
Each must be repaired (an output written, clean for both targets under doctor --strict) and load in vLLM with no
error, no parameter left unfilled, and every weight stored BF16 that vLLM holds as BF16 under the stored name
(routers it casts to float32 aside) equal to the stored tensor.
The EAGLE-3 draft loads as `vllm serve --speculative-config` loads it (tools/vllm_load.py). Gemma-4's multimodal class
builds here only beside a torchvision stand-in (the venv has none; transformers' Gemma-4 image processor imports it at
module level): the loader reports every call into the stand-in, and a load that called one is not vLLM's own result.
Where vLLM cannot build the architecture here at all (CANNOT_BUILD_HERE), its own error is asserted on the input and
on the output alike.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.sglang.defects import build_defects
from tests.sglang.fixtures import FIXTURES, NOT_BUILT
from tests.sglang.reports import REPORTS, gemma4_vision_linear

from .probe import requires_vllm, sha
from .test_llama_vs_vllm import ckpt_repair, vllm_load

pytestmark = [pytest.mark.vllm, requires_vllm]
TARGETS = "vllm==0.32.0,sglang==0.5.23"
SGLANG = "sglang==0.5.23"


# layouts vLLM 0.32 cannot build in this venv at all, the input as much as the output, and the error that says why
# (asserted for both: once vLLM builds one, the entry must go and its output is judged like the others)
CANNOT_BUILD_HERE: dict[str, str] = {}
# layouts whose stored BF16 tensors reach vLLM under other names (its hf_to_vllm_mapper renames them), so the name-by-name
# comparison below finds none: the test named compares them instead (every other layout must compare at least one)
COMPARED_ELSEWHERE = {"gemma4-vision-linear": "test_gemma4_multimodal_builds_and_loads_with_torchvision_never_called"}
MISLOADS = ("silent-garbage", "ignored-tensors")  # loaded wrong, or tensors skipped, without SGLang stopping


def sglang_refuses(folder: Path) -> bool:
    """doctor --target sglang==0.5.23 predicts SGLang stops on it or loads it wrong (a broken stored scale, which
    SGLang loads as is and only --original repairs, is not such a layout)."""
    proc = ckpt_repair("doctor", folder, "--target", SGLANG, "--json")
    assert proc.returncode in (0, 1), proc.stderr
    report = json.loads(proc.stdout)
    return bool(report["runtime_stops_at"]) or any(f["code"] in MISLOADS for f in report["findings"])


@pytest.fixture(scope="module")
def layouts(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("multitarget_vllm")
    out = build_defects(root / "defects")
    real = {name: build(root / "real" / name) for name, (folder, build) in FIXTURES.items() if folder not in NOT_BUILT}
    out.update({name: folder for name, folder in real.items() if sglang_refuses(folder)})
    out.update({name: build(root / "reports" / name) for name, build in REPORTS.items()})
    return out


@pytest.fixture(scope="module")
def fixed(layouts, tmp_path_factory) -> dict[str, tuple[object, Path]]:
    root = tmp_path_factory.mktemp("multitarget_fixed")
    return {name: (ckpt_repair("fix", folder, "-o", root / name, "--target", TARGETS, "--quiet"), root / name)
            for name, folder in layouts.items()}


@pytest.fixture(scope="module")
def loaded(layouts, fixed) -> dict[str, dict]:
    """vLLM's load of every output, and of the inputs of CANNOT_BUILD_HERE (as "<name>:input")."""
    dirs = {n: dest for n, (proc, dest) in fixed.items() if proc.returncode == 0 and dest.exists()}
    dirs.update({f"{n}:input": layouts[n] for n in CANNOT_BUILD_HERE})
    return dict(zip(dirs, vllm_load(list(dirs.values()))))


def test_every_layout_is_one_sglang_refuses(layouts):
    """The reports' layouts are ones SGLang refuses or mis-loads (else the test would show nothing for them)."""
    assert {n for n in REPORTS if not sglang_refuses(layouts[n])} == set()
    assert len(layouts) >= len(REPORTS) + 6 + 2  # the defects, and ct-llama-dense / the EAGLE-3 draft among the real


def test_the_fix_for_both_is_written_and_clean_for_each(fixed):
    failures = {}
    for name, (proc, dest) in fixed.items():
        if proc.returncode != 0 or not dest.exists():
            failures[name] = f"fix exit {proc.returncode}: {proc.stderr[-300:]}"
            continue
        for target in TARGETS.split(","):
            check = ckpt_repair("doctor", dest, "--target", target, "--strict")
            if check.returncode != 0:
                failures[name] = f"doctor --strict --target {target}: {check.stdout[-300:]}"
    assert not failures, failures


def test_the_fix_for_both_loads_in_vllm(fixed, loaded):
    failures = {}
    for name, result in ((n, loaded[n]) for n in fixed if n in loaded):
        if name in CANNOT_BUILD_HERE:
            for which in (name, f"{name}:input"):
                if loaded[which]["ok"] or CANNOT_BUILD_HERE[name] not in loaded[which].get("error", ""):
                    failures[which] = f"expected vLLM's own refusal ({CANNOT_BUILD_HERE[name]}): {str(loaded[which])[:300]}"
            continue
        if not result["ok"]:
            failures[name] = f"{result.get('error_type')}: {result.get('error', '')[:300]}"
            continue
        if result["stand_in_calls"]:
            failures[name] = f"the load called the torchvision stand-in: {result['stand_in_calls'][:3]}"
            continue
        stored = load_file(fixed[name][1] / "model.safetensors") if (fixed[name][1] / "model.safetensors").exists() else {}
        bf16 = {k: t for k, t in stored.items() if t.dtype == torch.bfloat16 and result["params"].get(k, {}).get("dtype") == "bfloat16"}
        wrong = [k for k, t in bf16.items() if result["params"][k]["sha256"] != sha(t)]
        if wrong:
            failures[name] = f"vLLM holds other values than stored for {wrong[:3]}"
        elif not bf16 and any(t.dtype == torch.bfloat16 for t in stored.values()) and name not in COMPARED_ELSEWHERE:
            failures[name] = "no stored BF16 tensor reached vLLM under its stored name: nothing was compared"
    assert not failures, failures
    assert set(fixed) <= set(loaded)


def test_gemma4_multimodal_builds_and_loads_with_torchvision_never_called(tmp_path):
    """vLLM 0.32 builds Gemma4ForConditionalGeneration here, input and fix output alike (sglang#24927's layout), with
    every vision and text parameter filled, while transformers still sees torchvision as not installed (the stand-in
    only satisfies its image processor's module-level import) and nothing in the stand-in is called: the methods vLLM
    chose per layer are its own. The vision tower the exclusion names is held BF16 and equals what fix stored."""
    folder = gemma4_vision_linear(tmp_path / "in")
    proc = ckpt_repair("fix", folder, "-o", tmp_path / "fixed", "--target", TARGETS, "--quiet")
    assert proc.returncode == 0, proc.stderr
    hostile = tmp_path / "hostile"  # config.json's architectures are the checkpoint's: vLLM's own error, not ours
    shutil.copytree(folder, hostile)
    config = json.loads((hostile / "config.json").read_text())
    (hostile / "config.json").write_text(json.dumps(dict(config, architectures=[{"x": 1}, 5, "../Gemma4"])))
    *results, refused = vllm_load([folder, tmp_path / "fixed", hostile])
    assert not refused["ok"] and refused["error_type"] == "ValidationError", refused
    results = dict(zip(("input", "fixed"), results))
    for which, result in results.items():
        assert result["ok"], (which, result.get("error"))
        assert result["architecture"] == "Gemma4ForConditionalGeneration" and result["stand_in_calls"] == []
        vision = {n: m["method"] for n, m in result["methods"].items() if "vision_tower" in n}
        assert vision and set(vision.values()) == {"UnquantizedLinearMethod"}, (which, vision)
        assert any(m["method"].startswith("ModelOpt") for n, m in result["methods"].items() if "language_model" in n)
    stored = load_file(tmp_path / "fixed" / "model.safetensors")
    params = results["fixed"]["params"]
    held = {k.removeprefix("model."): t for k, t in stored.items() if k.startswith("model.vision_tower.")}
    assert held and set(held) <= set(params), sorted(set(held) - set(params))
    assert [k for k, t in held.items() if params[k]["sha256"] != sha(t)] == []
