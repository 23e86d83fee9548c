"""DeepSeek-V4's two real quantization configs: doctor's per-layer decision for sglang==0.5.23 is SGLang's own.

SGLang 0.5.23's DeepseekV4ForCausalLM cannot be loaded here whole (tools/sglang_dsv4_layers.py says why), so, as
issue #28's dsv4 stream allows, SGLang's own quant config (made by its loader from each real config) is asked
`get_quant_method(layer, prefix)` for every layer of SGLang's own DeepSeek-V4 model, built from the tiny config, at the
exact prefixes and classes that model gives them. doctor's side: the declaration `--target sglang==0.5.23` reads for
the same folder, asked the same prefix (a FusedMoE at its first expert's `.0.gate_proj`, as get_moe_scheme asks):
the algorithm, or where SGLang raises, the refusal the bound rule predicts in SGLang's words.

What SGLang decides (and doctor now predicts): RedHatAI's compressed-tensors targets name vLLM's layers
(`fused_wqa_wkv`, `.*ffn.*`), SGLang 0.5.23 names them `self_attn.wqkv_a` and `mlp.*`, so it refuses the model
("Unable to find matching target"); nvidia's MIXED_PRECISION keys (`layers.N.ffn.experts`) resolve no SGLang layer,
so every layer is built BF16 (the mapper SGLang's loader applies, get_hf_to_sglang_mapper, is Quark's only).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from repair import arch, formats
from repair.io.checkpoint import open_checkpoint
from repair.targets.profiles import resolve
from tests.ct_group_cases import algorithm_of
from tools.dsv4_fixture import REAL
from tools.sglang_built_layers import write_tiny

from .probe import REPO, SGLANG_PY, TARGET, clean_env, requires_sglang

pytestmark = [pytest.mark.sglang, requires_sglang]
NVIDIA = REAL.parents[1] / "deepseek-v4-flash-nvfp4" / "hf_quant_config.json"
METHODS = {"CompressedTensorsW4A4Fp4": "NVFP4", "CompressedTensorsW4A16Fp4": "W4A16_NVFP4", "ModelOptFp4LinearMethod": "NVFP4",
           "ModelOptNvFp4FusedMoEMethod": "NVFP4", "ModelOptFp8LinearMethod": "FP8"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("dsv4_sglang")
    out = {name: root / name for name in ("plain", "redhatai-deepseek-v4-flash-nvfp4-fp8", "deepseek-v4-flash-nvfp4")}
    quantization = json.loads(REAL.read_text())["quantization_config"]
    for name, folder in out.items():
        write_tiny(folder, quantization if name.startswith("redhatai") else None)
    shutil.copy(NVIDIA, out["deepseek-v4-flash-nvfp4"] / "hf_quant_config.json")
    return out


@pytest.fixture(scope="module")
def sglang(folders) -> dict[str, dict]:
    proc = subprocess.run([str(SGLANG_PY), str(REPO / "tools" / "sglang_dsv4_layers.py"), *map(str, folders.values())],
                          capture_output=True, text=True, timeout=900, env=clean_env(), cwd="/")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {Path(line["dir"]).name: line for line in map(json.loads, proc.stdout.splitlines())}


def sglang_answer(layer: dict) -> str | None:
    method = layer["method"]
    if ": " in method:
        return method  # SGLang raised building this layer
    if method == "CompressedTensorsW8A8Fp8":
        return algorithm_of({"weights": {"num_bits": 8, "type": "float", "strategy": layer["strategy"],
                                         "block_structure": [128, 128]}, "input_activations": True})
    return METHODS.get(method)


@pytest.mark.parametrize("name", ["redhatai-deepseek-v4-flash-nvfp4-fp8", "deepseek-v4-flash-nvfp4"])
def test_each_sglang_layers_decision_is_doctors(name, folders, sglang):
    ckpt = open_checkpoint(folders[name])
    target = resolve(TARGET)
    declaration = target.bind(formats.detect(ckpt).read_declaration(ckpt), arch.architecture(ckpt.config, target.release),
                              ckpt.config)
    rule = declaration.rule()
    theirs, ours = {}, {}
    for prefix, layer in sglang[name]["layers"].items():
        if layer["class"] in ("RadixAttention", "VocabParallelEmbedding"):
            continue  # KV cache and embedding methods: no scheme of a config group
        asked = f"{prefix}.0.gate_proj" if layer["class"] == "FusedMoE" else prefix
        theirs[prefix] = sglang_answer(layer)
        refusal = getattr(rule, "fused_refusal", lambda *_: None)(asked, ())
        ours[prefix] = declaration.algorithm(asked) or refusal
    assert len(theirs) > 10
    assert ours == theirs
