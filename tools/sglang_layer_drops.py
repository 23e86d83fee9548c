#!/usr/bin/env python
"""The `dropped_in_layers` block of repair/targets/data/sglang-<release>.json, learned from SGLang's own build.

    python -m tools.sglang_layer_drops [SGLANG_VENV]   (default /work/venvs/sglang; rewrites the installed release's file)

SGLang's DeepseekV4ForCausalLM builds a module in some decoder layers only, as config.json's per-layer
`compress_ratios` says (0.5.23 models/deepseek_v4.py:1449-1476: `compressor` where the ratio is 4 or 128, `indexer`
where it is 4). The rule is learned as vLLM's is (tools/vllm_layer_facts.py where_rules, the same function): the
published checkpoint's names (tools/dsv4_fp8_fixture.py, nvidia's layout: each layer stores what its ratio builds)
give each module's layers without it; SGLang's model, built by its own constructor on the meta device from the tiny
published config (tools/sglang_dsv4_layers.py's setup), must lack a module in exactly those layers, and again, built
with the list rotated by one, in the layers the rotation moves the values to. Names are never mapped: the layer sets
must agree. Run in SGLang's venv as `sglang_layer_drops.py --build PLAIN_DIR NAMES.json` it prints the block's row.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROOT = Path(__file__).resolve().parents[1]
ARCH = "DeepseekV4ForCausalLM"


def learn(plain: str, names_file: str) -> dict:
    """(In SGLang's venv) checkpoint module pattern -> {"where", "in"} for the model SGLang builds from `plain`."""
    from tools import sglang_runtime as runtime
    from tools.sglang_dsv4_layers import cpu_rope
    from tools.vllm_layer_facts import where_rules

    cpu_rope()
    names = json.loads(Path(names_file).read_text())
    config = json.loads((Path(plain) / "config.json").read_text())

    def rebuild(changed: dict):
        with tempfile.TemporaryDirectory() as folder:
            shutil.copy(Path(plain) / "model.safetensors", folder)
            (Path(folder) / "config.json").write_text(json.dumps(changed))
            return runtime.build(folder)[0]

    return where_rules(runtime.build(plain)[0], dict.fromkeys(names), config, rebuild)


def write_plain(folder: Path) -> tuple[Path, Path]:
    """(the tiny published config without quantization, SGLang's input; the published tensor names of that config)."""
    import torch
    from safetensors.torch import save_file

    from tools import dsv4_fp8_fixture

    config = {k: v for k, v in dsv4_fp8_fixture.config().items() if v is not None and k != "quantization_config"}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"embed.weight": torch.zeros(2, 2)}, str(folder / "model.safetensors"))
    names = folder.parent / "names.json"
    names.write_text(json.dumps(sorted(dsv4_fp8_fixture.tensors(config))))
    return folder, names


def generate(venv: Path) -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "SGLANG_USE_CPU_ENGINE")}
    with tempfile.TemporaryDirectory() as tmp:
        plain, names = write_plain(Path(tmp) / "plain")
        proc = subprocess.run([str(venv / "bin" / "python"), str(ROOT / "tools" / "sglang_layer_drops.py"), "--build",
                               str(plain), str(names)], capture_output=True, text=True, timeout=900, env=env, cwd="/")
    if proc.returncode != 0:
        raise SystemExit(f"SGLang's build failed:\n{proc.stderr[-4000:]}")
    return {ARCH: json.loads(proc.stdout.splitlines()[-1])}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--build"]:
        out = os.fdopen(os.dup(1), "w", buffering=1)
        os.dup2(2, 1)
        out.write(json.dumps(learn(argv[1], argv[2])) + "\n")
        return 0
    from tools.sglang_built_layers import write_generated

    return write_generated([argv[0] if argv else "/work/venvs/sglang"], "dropped_in_layers", generate)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
