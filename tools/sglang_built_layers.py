"""The `built_layers` block of repair/targets/data/sglang-<release>.json, generated from SGLang's own model code.

    python -m tools.sglang_built_layers [SGLANG_VENV]   (default /work/venvs/sglang-0.5.23; rewrites the data file)

SGLang's constructor asks its quant config about every layer under SGLang's own prefix (`get_quant_method(layer,
prefix)`), and a compressed-tensors config whose targets name no such prefix stops the build ("Unable to find
matching target"). Where SGLang's names differ from the checkpoint's (DeepSeek-V4: checkpoint `layers.N.attn.wq_a`,
SGLang `model.layers.N.self_attn.wqkv_a`), doctor cannot see this from the checkpoint's names; so the layers are
recorded here: SGLang's model built on the meta device from the tiny published config (tools/sglang_dsv4_layers.py
in SGLang's venv), each prefix that asks a quant method with its class, layer numbers as `*`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tools.dsv4_fixture import REAL, TINY

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "repair" / "targets" / "data"
NO_SCHEME = ("RadixAttention", "VocabParallelEmbedding")  # KV-cache and embedding methods: no config-group scheme
NUMBER = re.compile(r"\.\d+(?=\.|$)")


def write_tiny(folder: Path, quantization: dict | None) -> Path:
    """The published DeepSeek-V4 config at tiny size, with `quantization` as its quantization_config (None: plain);
    keys published as null are left out: SGLang 0.5.23's DeepSeekV4Config refuses `kv_lora_rank: null`."""
    import torch
    from safetensors.torch import save_file

    config = {k: v for k, v in (json.loads(REAL.read_text()) | TINY).items() if v is not None}
    config.pop("quantization_config")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config | ({"quantization_config": quantization} if quantization else {})))
    save_file({"embed.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    return folder


def sglang_layers(venv: Path, folder: Path) -> dict[str, str]:
    """SGLang's own {prefix: class} for the model in `folder`, from its constructor (run in SGLang's venv)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SGLANG_USE_CPU_ENGINE")}
    proc = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "sglang_dsv4_layers.py"), str(folder)],
                          capture_output=True, text=True, timeout=900, env=env, cwd="/", check=True)
    return json.loads(proc.stdout.splitlines()[0])["layers"]


def patterns(layers: dict[str, str]) -> dict[str, str]:
    """{prefix pattern (layer numbers as `*`): class} of the layers that ask a config-group scheme, in the order SGLang's
    constructor builds them (the first refused one is where it stops)."""
    return {NUMBER.sub(".*", p): c for p, c in layers.items() if c not in NO_SCHEME}


def generate(venv: Path) -> dict[str, dict[str, str]]:
    with tempfile.TemporaryDirectory() as tmp:
        return {"DeepseekV4ForCausalLM": patterns(sglang_layers(venv, write_tiny(Path(tmp) / "plain", None)))}


def write_generated(argv: list[str], key: str, make) -> int:
    """Rewrite the `key` block of the installed SGLang release's data file with `make(venv)` (argv: [SGLANG_VENV])."""
    venv = Path(argv[0] if argv else "/work/venvs/sglang-0.5.23")
    release = subprocess.run([str(venv / "bin" / "python"), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                             capture_output=True, text=True, check=True).stdout.strip()
    path = DATA / f"sglang-{release}.json"
    doc = json.loads(path.read_text(encoding="utf-8"))
    doc["rules"][key] = make(venv)
    path.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return 0


def main(argv: list[str]) -> int:
    return write_generated(argv, "built_layers", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
