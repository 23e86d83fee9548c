"""The `layer_names` block of repair/targets/data/sglang-<release>.json, generated from SGLang's own model code.

    python -m tools.sglang_layer_names [SGLANG_VENV]   (default /work/venvs/sglang-0.5.23; rewrites the data file)

SGLang applies a config's exclusions to the prefix each layer's constructor hands `get_quant_method`, and for a fused
layer to the shard names `is_layer_skipped` makes from it (`prefix.replace("qkv_proj", "q_proj")`). Where that name
differs from the checkpoint module loaded into the layer, an exclusion written under the checkpoint's name never
reaches SGLang's layer: Gemma 4's vision `...self_attn.q_proj.linear` loads into the QKVParallelLinear SGLang asks
about as `...self_attn.qkv_proj`, whose shard is `...self_attn.q_proj` (sglang#24927). Each real-config fixture
(tools/real_fixture.REAL_MODELS) is loaded by SGLang's own load_weights in its venv (tools/sglang_probe.py `load`: the
asked prefix of every layer, the parameter each checkpoint tensor reached, the shard id its loader got), and every
checkpoint module whose SGLang name differs is recorded, layer numbers as `*`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.sglang_built_layers import ROOT, write_generated

NUMBER = re.compile(r"\.\d+(?=\.|$)")
QKV_SHARDS = {"q": 0, "k": 1, "v": 2}  # QKVParallelLinear's loaded_shard_id -> its index among the fused shards
WEIGHTS = (".weight", ".weight_packed")


def sglang_name(line: dict, tensor: str) -> str | None:
    """The name SGLang's exclusion rules ask about for the layer `tensor` (a weight) was loaded into: the layer's
    asked prefix, or for a fused layer the shard name is_layer_skipped derives from it; None when no asked layer took
    it (routed experts: SGLang asks their FusedMoE, which the rules already name from the checkpoint's expert)."""
    owners, layers = line["owners"], line["layers"]
    params = line["routes"].get(tensor) or []
    layer = next((layers[owners[p]] for p in params if owners.get(p) in layers), None)
    if layer is None or not layer.get("asked") or layer["class"] == "FusedMoE":
        return None
    asked, fused = layer["asked"], layer.get("fused")
    if not fused:
        return asked
    shard = line.get("shard_ids", {}).get(tensor)
    index = QKV_SHARDS.get(shard, shard) if isinstance(shard, str) else shard
    if not isinstance(index, int) or not 0 <= index < len(fused):
        return None
    return asked.replace(asked.rpartition(".")[2], fused[index])


def layer_names(line: dict) -> dict[str, str]:
    """{checkpoint module pattern: SGLang's name pattern} for every loaded weight whose two names differ."""
    out = {}
    for tensor in sorted(line.get("routes", {})):
        if not tensor.endswith(WEIGHTS):
            continue
        module, name = tensor.rpartition(".")[0], sglang_name(line, tensor)
        if name is not None and name != module:
            out[NUMBER.sub(".*", module)] = NUMBER.sub(".*", name)
    return out


def probe(venv: Path, folders: list[Path]) -> list[dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SGLANG_USE_CPU_ENGINE")}
    proc = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "sglang_probe.py"), "load", *map(str, folders)],
                          capture_output=True, text=True, timeout=1800, env=env, cwd="/", check=True)
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def generate(venv: Path) -> dict[str, dict[str, str]]:
    """{architecture: its layer names} over every real-config fixture SGLang builds (architectures without a
    difference are left out)."""
    from tools.real_fixture import REAL_MODELS, write_real_model

    with tempfile.TemporaryDirectory() as tmp:
        folders = [write_real_model(Path(tmp) / key, key) for key in sorted(REAL_MODELS)]
        out: dict[str, dict[str, str]] = {}
        for folder, line in zip(folders, probe(venv, folders)):
            names = layer_names(line) if "layers" in line else {}
            if names:
                architecture = json.loads((folder / "config.json").read_text())["architectures"][0]
                out.setdefault(architecture, {}).update(names)
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    return write_generated(argv, "layer_names", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
