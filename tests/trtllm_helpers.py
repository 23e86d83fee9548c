"""Checkpoints for the TensorRT-LLM tests: the real-config fixtures (tools/real_fixture.py, tools/layout_fixture.py)
with the one thing their random scalars do not do as ModelOpt's export does: fused siblings (q/k/v, gate/up) share
one input_scale (ModelOpt unifies the input quantizers of layers that read the same input), and TensorRT-LLM asserts
it (tests/data/trtllm/PROVENANCE.md, NVFP4LinearMethod.load_weight_scales)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from safetensors.torch import load_file, save_file

from tests.conftest import run_captured

SIBLING = re.compile(r"(.*)\.(q_proj|k_proj|v_proj|gate_proj|up_proj)\.input_scale$")


def share_sibling_input_scales(folder: Path) -> Path:
    path = Path(folder) / "model.safetensors"
    tensors = load_file(path)
    groups: dict[tuple[str, bool], list[str]] = {}
    for name in tensors:
        if m := SIBLING.match(name):
            groups.setdefault((m[1], m[2] in ("q_proj", "k_proj", "v_proj")), []).append(name)
    for names in groups.values():
        top = max(tensors[n] for n in names)
        tensors.update({n: top.clone() for n in names})
    save_file(tensors, path, metadata={"format": "pt"})
    return Path(folder)


def edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc, indent=4))


def doctor_json(capsys, src: Path, target: str, *flags: str) -> tuple[int, dict]:
    code, out, err = run_captured(capsys, "doctor", src, "--target", target, "--json", *flags)
    assert code in (0, 1), err
    return code, json.loads(out)


def findings(report: dict, code: str | None = None) -> list[dict]:
    return [f for f in report["findings"] if code is None or f["code"] == code]
