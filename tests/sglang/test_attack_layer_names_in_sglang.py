"""SGLang's own load judges tests/test_attack_layer_names.py's kept entry: with Gemma 4's vision `.linear` exclusions
plus SGLang's fused name `...self_attn.qkv_proj` (which doctor had called unused and fix had removed), fix --target
vllm==0.32.0,sglang==0.5.23 keeps that entry, and SGLang 0.5.23 builds the fused vision q/k/v BF16 and loads the output
with no error and no weight skipped."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.test_attack_layer_names import vision_linear_with_sglangs_fused_name

from .probe import REPO, TARGET, load_in_sglang, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]


def test_sglang_loads_the_output_that_keeps_its_fused_name(tmp_path):
    src = vision_linear_with_sglangs_fused_name(tmp_path / "src")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "repair", "fix", str(src), "-o", str(out), "--target", f"vllm==0.32.0,{TARGET}"],
                          capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr
    line = load_in_sglang([out])[out]
    assert line["ok"], line.get("error")
    assert line["layers"]["vision_tower.encoder.layers.0.self_attn.qkv.qkv_proj"]["scheme"] == "bf16"
    assert not [t for t in line.get("skipped", []) if t.endswith(".weight")], line["skipped"]
