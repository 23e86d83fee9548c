"""ModelOpt MIXED_PRECISION `quantized_layers` keys in vLLM 0.32's real loader, for a class whose mapper renames
(GptOss: `.self_attn.` -> `.attn.`, gpt_oss.py hf_to_vllm_mapper). ModelOptMixedPrecisionConfig.apply_vllm_mapper maps
the keys with it (WeightsMapper.apply_dict, modelopt.py:1885-1888) before any layer asks, and each attention layer asks
under vLLM's name (`model.layers.N.attn.qkv_proj`). The folders: ModelOpt's own NVFP4 export of a tiny gpt-oss
(tools/modelopt_gptoss_export.py), made loadable by `fix --target vllm==0.32.0` (its experts BF16), then declared
MIXED_PRECISION in config.json with the NVFP4 attention layers keyed
  ckpt      in the checkpoint's spelling (`model.layers.N.self_attn.q_proj`): vLLM maps them to its own;
  vllm      in vLLM's spelling (`model.layers.N.attn.q_proj`): vLLM leaves them (doctor read them as BF16 before);
  unread    without `model.` (`layers.N.self_attn.q_proj`): no key vLLM asks, so it builds them BF16 and the load stops;
  bf16      as `vllm`, layer 0's o_proj stored BF16: vLLM builds it NVFP4 and the load stops; `fixed` is fix --target's
            output of it (the key vLLM reads it by out of the map);
  qkv       as `vllm`, layer 0's q/k/v_proj stored BF16 and keyed by the layer vLLM builds of them (`attn.qkv_proj`, a
            name no stored module has): vLLM finds that key directly and builds it NVFP4, so the load stops;
            `qkv_fixed` is fix --target's output of it.
doctor --target vllm==0.32.0 exits 0 exactly where vLLM loads the folder.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .probe import requires_vllm
from .test_llama_vs_vllm import ckpt_repair, vllm_load

pytestmark = [pytest.mark.vllm, requires_vllm]

TARGET = "vllm==0.32.0"
SPELLINGS = {"ckpt": "model.layers.{}.self_attn.", "vllm": "model.layers.{}.attn.", "unread": "layers.{}.self_attn.",
             "bf16": "model.layers.{}.attn.", "qkv": "model.layers.{}.attn."}
PROJ = ("q_proj", "k_proj", "v_proj", "o_proj")


def declared_mixed(src: Path, out: Path, key: str) -> Path:
    """`src` (fix's output) with its ModelOpt NVFP4 declaration made MIXED_PRECISION: every stored NVFP4 attention
    layer keyed `key` (its layer number in `{}`), the exclusions kept."""
    shutil.copytree(src, out)
    config = json.loads((out / "config.json").read_text())
    hf = json.loads((out / "hf_quant_config.json").read_text())
    (out / "hf_quant_config.json").unlink()
    layers = {key.format(n) + p: {"quant_algo": "NVFP4", "group_size": 16} for n in range(2) for p in PROJ}
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
                                     "ignore": hf["quantization"]["exclude_modules"], "quantized_layers": layers}
    (out / "config.json").write_text(json.dumps(config))
    return out


def with_bf16(folder: Path, projs: tuple[str, ...] = ("o_proj",)) -> Path:
    """Layer 0's `projs` replaced by their BF16 dequantization (fix --target bf16's bytes of them)."""
    from safetensors.torch import load_file, save_file

    whole = folder.parent / f"whole-bf16-{folder.name}"
    assert ckpt_repair("fix", folder, "-o", whole, "--target", "bf16", "--quiet").returncode == 0
    tensors, dense = load_file(folder / "model.safetensors"), load_file(whole / "model.safetensors")
    for name in (f"model.layers.0.self_attn.{p}" for p in projs):
        for leaf in ("weight", "weight_scale", "weight_scale_2", "input_scale"):  # its bias stays
            tensors.pop(f"{name}.{leaf}")
        tensors[f"{name}.weight"] = dense[f"{name}.weight"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def keyed_by_qkv_proj(folder: Path) -> Path:
    """Layer 0's q/k/v_proj keys replaced by one key naming the layer vLLM builds of them, `attn.qkv_proj`."""
    config = json.loads((folder / "config.json").read_text())
    layers = config["quantization_config"]["quantized_layers"]
    for p in PROJ[:3]:
        layers.pop(f"model.layers.0.attn.{p}")
    layers["model.layers.0.attn.qkv_proj"] = {"quant_algo": "NVFP4", "group_size": 16}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from tools.modelopt_gptoss_export import export_gpt_oss

    root = tmp_path_factory.mktemp("mixed_keys")
    src = export_gpt_oss(root / "export")
    loadable = root / "loadable"
    assert ckpt_repair("fix", "--target", TARGET, src, "-o", loadable, "--quiet").returncode == 0
    out = {name: declared_mixed(loadable, root / name, key) for name, key in SPELLINGS.items()}
    with_bf16(out["bf16"])
    keyed_by_qkv_proj(with_bf16(out["qkv"], PROJ[:3]))
    for name, made in (("bf16", "fixed"), ("qkv", "qkv_fixed")):
        fixed = ckpt_repair("fix", out[name], "-o", root / made, "--target", TARGET, "--quiet")
        assert fixed.returncode == 0, fixed.stdout + fixed.stderr
        out[made] = root / made
    return out


@pytest.fixture(scope="module")
def loaded(folders) -> dict[str, dict]:
    return dict(zip(folders, vllm_load(list(folders.values()))))


def test_vllm_loads_keys_in_either_spelling_and_not_keys_it_never_asks(loaded):
    assert loaded["ckpt"]["ok"] and loaded["vllm"]["ok"] and loaded["fixed"]["ok"] and loaded["qkv_fixed"]["ok"], loaded
    assert not loaded["unread"]["ok"] and not loaded["bf16"]["ok"] and not loaded["qkv"]["ok"]
    for name in ("ckpt", "vllm"):  # the attention built NVFP4 from the mapped keys, the experts unquantized
        methods = loaded[name]["methods"]
        assert {m["method"] for k, m in methods.items() if k.endswith(("attn.qkv_proj", "attn.o_proj"))} != \
            {"UnquantizedLinearMethod"}, methods


@pytest.mark.parametrize("name", list(SPELLINGS) + ["fixed", "qkv_fixed"])
def test_doctor_passes_exactly_where_vllm_loads(folders, loaded, name):
    said = ckpt_repair("doctor", folders[name], "--target", TARGET)
    assert said.returncode == (0 if loaded[name]["ok"] else 1), (name, said.stdout, loaded[name].get("error"))


def test_fix_takes_the_key_vllm_reads_out_of_the_map(folders):
    layers = json.loads((folders["fixed"] / "config.json").read_text())["quantization_config"]["quantized_layers"]
    assert "model.layers.0.attn.o_proj" not in layers and "model.layers.1.attn.o_proj" in layers, layers
