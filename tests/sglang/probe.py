"""Shared helpers of the SGLang consumer tier: running tools/sglang_probe.py, SGLang's per-layer verdicts, doctor's.

The probe runs in the separate .venv-sglang (tools/sglang_env.sh) as a subprocess; the tests run in the
project's .venv. SGLang's answer for a checkpoint module comes from the probe's trace: the checkpoint tensor
`<module>.weight` (or `weight_packed`) was handed to a parameter of SGLang layer P, so the module is built as
P's scheme. A module whose weight was merged before loading (DeepSeek's q_a_proj + kv_a_proj_with_mqa are
concatenated by its load_weights) is found through the layer's fused shards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SGLANG_VENV = Path(os.environ.get("SGLANG_VENV", REPO / ".venv-sglang"))
SGLANG_PY = SGLANG_VENV / "bin" / "python"
PROBE = REPO / "tools" / "sglang_probe.py"
TARGET = "sglang==0.5.23"
PROBE_TIMEOUT_S = 1200

requires_sglang = pytest.mark.skipif(not SGLANG_PY.exists(),
                                     reason=f"{SGLANG_PY} does not exist (create it with tools/sglang_env.sh)")


def clean_env() -> dict[str, str]:
    drop = ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "SGLANG_USE_CPU_ENGINE")
    return {k: v for k, v in os.environ.items() if k not in drop}


def run_probe(*args) -> list[dict]:
    proc = subprocess.run([str(SGLANG_PY), str(PROBE), *map(str, args)], capture_output=True, text=True,
                          timeout=PROBE_TIMEOUT_S, env=clean_env(), cwd="/")
    assert proc.returncode == 0, f"probe exited {proc.returncode}\nstderr tail:\n{proc.stderr[-4000:]}"
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def run_tool_probe(script: str, *args: str) -> dict:
    """A tools/ probe run in SGLang's venv, its last stdout line read as JSON."""
    proc = subprocess.run([str(SGLANG_PY), str(REPO / "tools" / script), *args], capture_output=True, text=True,
                          timeout=600, env=clean_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.splitlines()[-1])


def load_in_sglang(dirs: list[Path], digests: bool = False) -> dict[Path, dict]:
    lines = run_probe("load", *dirs, *(["--digests"] if digests else []))
    assert [line["dir"] for line in lines] == [str(d) for d in dirs]
    return dict(zip(dirs, lines))


def repair_json(*args) -> tuple[int, dict]:
    proc = subprocess.run([sys.executable, "-m", "repair", *map(str, args), "--json"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=600)
    assert proc.returncode in (0, 1, 2), proc.stderr[-4000:]
    return proc.returncode, json.loads(proc.stdout) if proc.stdout.strip() else {"stderr": proc.stderr}


def stored_layers(folder: Path) -> list[str]:
    """Checkpoint modules with a 2-D (or wider) weight, read from the safetensors headers: the layers doctor's
    `schemes` covers."""
    from safetensors import safe_open

    out = set()
    for shard in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            for name in f.keys():
                module, _, leaf = name.rpartition(".")
                if leaf in ("weight", "weight_packed") and len(f.get_slice(name).get_shape()) >= 2:
                    out.add(module)
    return sorted(out)


def sglang_schemes(line: dict, stored: list[str]) -> dict[str, str]:
    """Stored layer (checkpoint module name) -> the scheme SGLang built it as; "not loaded" when no SGLang layer took it."""
    layers, owners, routes = line["layers"], line["owners"], line["routes"]
    by_shard = {}
    for prefix, layer in layers.items():
        parent, _, leaf = prefix.rpartition(".")
        for shard in layer["fused"] or ():
            by_shard[f"{parent}.{shard}" if parent else shard] = prefix
    out = {}
    for module in stored:
        params = routes.get(f"{module}.weight") or routes.get(f"{module}.weight_packed") or []
        prefix = next((owners[p] for p in params if owners.get(p) in layers), None) or by_shard.get(module)
        out[module] = layers[prefix]["scheme"] if prefix in layers else "not loaded"
    return out


def disagreements(doctor: dict[str, str], sglang: dict[str, str]) -> list[tuple[str, str, str]]:
    """(layer, doctor's answer, SGLang's answer) for every stored layer where they differ."""
    return [(m, doctor.get(m, "-"), sglang.get(m, "-")) for m in sorted(set(doctor) | set(sglang))
            if doctor.get(m, "-") != sglang.get(m, "-")]
