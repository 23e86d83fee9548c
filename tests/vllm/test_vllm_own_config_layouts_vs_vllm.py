"""The rows of architectures whose config class only vLLM ships, judged on the checkpoint layout vLLM itself reads.

Their generated rows (tools/vllm_profile_configs.py `vllm_config_class`) describe vLLM's build alone: no transformers
class writes their checkpoints, and no published model.safetensors.index.json of these families (THUDM/chatglm3-6b,
THUDM/glm-4-9b-chat, stepfun-ai/step3, stepfun-ai/Step-3.5-Flash) is stored offline, so tests/data/real has none.
The names here are the ones vLLM 0.32's own loaders take from a published checkpoint:
- ChatGLM: the export of tools/vllm_arch_check.py (vLLM's names) with the published embedding name
  `transformer.embedding.word_embeddings.weight` (chatglm.py:317-319 maps `.word_embeddings` away) and the rotary
  buffer `transformer.rotary_pos_emb.inv_freq` the published checkpoints store (model_executor/models/utils.py:233-236
  drops it).
- Step3Text: separate `self_attn.{q,k,v}_proj` (step3_text.py:386-410 qkv_params_mapping), `mlp.{gate,up}_proj`
  (:412-416), 3-D `moe.{gate,up,down}_proj.weight` (:423-439), `share_expert.*`, as its load_weights reads them.
Each checkpoint is loaded by vLLM 0.32's own loader on CPU; doctor --target vllm==0.32.0 must agree with it, or, for
Step3Text (unprofiled: vLLM's own names hold fused experts, no layout to learn), say it has no loader profile.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from repair.codec import nvfp4
from tests.conftest import run_captured

from .probe import REPO, VLLM_PY, requires_vllm
from .test_profiles_vs_vllm import in_vllm

pytestmark = [pytest.mark.vllm, requires_vllm]

TARGET = "vllm==0.32.0"
SMALL = """
import json, sys
sys.path.insert(0, sys.argv[1])
from vllm_profile_configs import model_types, small_config
print(json.dumps(small_config(sys.argv[2], model_types())[0], default=str))
"""
# why vLLM 0.32 refuses the Step3Text NVFP4 exports; a row learned from vLLM's own names (fused qkv_proj, prefix-less
# layers) saw neither, and called them healthy: the generator now leaves Step3Text unprofiled (own_names_layout)
REFUSED = {
    "nvfp4": "step3_text.py:488-506 copies each of q/k/v_proj's tensors into a narrow of qkv_proj's parameter "
             "(`param.output_dim`), which NVFP4's per-tensor weight_scale_2 has not",
    "qkv_excluded": "step3_text.py:534 builds Step3TextModel with the caller's prefix (\"\"), so vLLM matches exclusions "
                    "against `layers.0.self_attn.qkv_proj`, never the export's `model.layers.0.self_attn.q_proj`",
}


def small_config(arch: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = subprocess.run([str(VLLM_PY), "-c", SMALL, str(REPO / "tools"), arch], capture_output=True, text=True,
                          timeout=900, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]), architectures=[arch], torch_dtype="bfloat16")


def modelopt(excluded: list[str]) -> dict:
    return {"producer": {"name": "modelopt", "version": "0.33.0"},
            "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None, "group_size": 16,
                             "exclude_modules": excluded}}


def step3_text(folder: Path, config: dict, bf16: tuple[str, ...] | None) -> Path:
    """A tiny Step3Text checkpoint in the layout its load_weights reads: all BF16 (`bf16` None), else a ModelOpt NVFP4
    export (one weight_scale_2 per fused group, as ModelOpt writes it) whose modules named in `bf16`, lm_head and the
    MoE layers are stored BF16 and excluded under those names (the checkpoint's, as ModelOpt writes them)."""
    hidden, q_dim, head = config["hidden_size"], config["share_q_dim"], config["head_dim"]
    inter, moe_inter, share = config["intermediate_size"], config["moe_intermediate_size"], config["share_expert_dim"]
    experts, vocab = config["moe_num_experts"], config["vocab_size"]
    moe_layers = {int(i) for i in str(config["moe_layers_enum"]).split(",")} & set(range(config["num_hidden_layers"]))
    gen = torch.Generator().manual_seed(0)

    def draw(*shape):
        return (torch.randn(*shape, generator=gen) / 16).to(torch.bfloat16)

    def ones(size=hidden):
        return torch.ones(size, dtype=torch.bfloat16)

    tensors = {"model.embed_tokens.weight": draw(vocab, hidden), "model.norm.weight": ones(), "lm_head.weight": draw(vocab, hidden)}
    linears: dict[str, tuple[int, int]] = {}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        tensors |= {p + "input_layernorm.weight": ones(), p + "post_attention_layernorm.weight": ones(),
                    p + "self_attn.inter_norm.weight": ones(q_dim)}
        linears |= {p + "self_attn.q_proj": (q_dim, hidden), p + "self_attn.k_proj": (head, hidden),
                    p + "self_attn.v_proj": (head, hidden), p + "self_attn.wq": (config["num_attention_heads"] * head, q_dim),
                    p + "self_attn.o_proj": (hidden, config["num_attention_heads"] * head)}
        if layer in moe_layers:
            tensors |= {p + "moe.gate.weight": draw(experts, hidden), p + "moe.gate_proj.weight": draw(experts, moe_inter, hidden),
                        p + "moe.up_proj.weight": draw(experts, moe_inter, hidden),
                        p + "moe.down_proj.weight": draw(experts, hidden, moe_inter)}
            linears |= {p + "share_expert.gate_proj": (share, hidden), p + "share_expert.up_proj": (share, hidden),
                        p + "share_expert.down_proj": (hidden, share)}
        else:
            linears |= {p + "mlp.gate_proj": (inter, hidden), p + "mlp.up_proj": (inter, hidden), p + "mlp.down_proj": (hidden, inter)}
    for module, shape in linears.items():
        if bf16 is None or module in bf16:
            tensors[f"{module}.weight"] = draw(*shape)
            continue
        packed, scale, scale_2 = nvfp4.quantize(draw(*shape), torch.tensor(1e-4))  # fused siblings share it
        tensors |= {f"{module}.weight": packed, f"{module}.weight_scale": scale, f"{module}.weight_scale_2": scale_2,
                    f"{module}.input_scale": torch.tensor(0.01)}
    folder.mkdir(parents=True)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config))
    if bf16 is not None:
        excluded = ["lm_head", *bf16, *(f"model.layers.{i}.moe*" for i in sorted(moe_layers))]
        (folder / "hf_quant_config.json").write_text(json.dumps(modelopt(excluded)))
    return folder


def chatglm_published(healthy: Path, folder: Path, exclude_output_layer: bool) -> Path:
    """tools/vllm_arch_check.py's healthy ChatGLM export with the published embedding name and rotary buffer."""
    shutil.copytree(healthy, folder)
    tensors = load_file(healthy / "model.safetensors")
    tensors["transformer.embedding.word_embeddings.weight"] = tensors.pop("transformer.embedding.weight")
    tensors["transformer.rotary_pos_emb.inv_freq"] = torch.rand(8)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    quant = json.loads((healthy / "hf_quant_config.json").read_text())
    if not exclude_output_layer:
        quant["quantization"]["exclude_modules"].remove("transformer.output_layer")
    (folder / "hf_quant_config.json").write_text(json.dumps(quant))
    return folder


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, dict]]:
    """(checkpoint, variant) -> (folder, vLLM 0.32's load of it): one vLLM process for every load."""
    root = tmp_path_factory.mktemp("own_config_layouts")
    line = in_vllm("vllm_arch_check.py", root / "arch", "ChatGLMModel")[0]
    assert line["ok"] and line["names_from"] == "vllm", line
    healthy = Path(line["healthy"])
    config = small_config("Step3TextForCausalLM")
    dense = dict(config, num_hidden_layers=1)  # its layer 0 is dense (moe_layers_enum "1"): no experts to store
    qkv = tuple(f"model.layers.0.self_attn.{x}_proj" for x in "qkv")
    folders = {("chatglm", "healthy"): chatglm_published(healthy, root / "chatglm_healthy", True),
               ("chatglm", "output_layer_not_excluded"): chatglm_published(healthy, root / "chatglm_broken", False),
               ("step3text", "bf16"): step3_text(root / "step3_bf16", config, None),
               ("step3text", "nvfp4"): step3_text(root / "step3_nvfp4", dense, ()),
               ("step3text", "qkv_excluded"): step3_text(root / "step3_qkv_excluded", dense, qkv)}
    loads = in_vllm("vllm_load.py", *folders.values(), "--moe-emulation")
    return {key: (folder, load) for (key, folder), load in zip(folders.items(), loads)}


def test_step3_text_layout_is_the_one_vllm_reads(judged):
    """The BF16 checkpoint loads: the names are what step3_text.py's load_weights takes (else nothing here judges);
    the NVFP4 exports fail in vLLM 0.32 for the reasons REFUSED states (strict: another error is another finding)."""
    assert judged["step3text", "bf16"][1]["ok"], judged["step3text", "bf16"][1]
    errors = {v: f"{judged['step3text', v][1]['error_type']}: {judged['step3text', v][1]['error']}"
              for v in ("nvfp4", "qkv_excluded")}
    assert errors["nvfp4"] == "AttributeError: 'PerTensorScaleParameter' object has no attribute 'output_dim'", errors
    assert errors["qkv_excluded"].startswith("RuntimeError: The size of tensor a"), errors


@pytest.mark.parametrize("key", [("chatglm", "healthy"), ("chatglm", "output_layer_not_excluded"), ("step3text", "bf16")])
def test_doctor_agrees_with_vllms_loader(judged, key, capsys):
    folder, loaded = judged[key]
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, folder)
    assert code in (0, 1), err
    assert (code == 0) == loaded["ok"], f"{key}: doctor exits {code}; vLLM 0.32: {loaded.get('error_type')}: " \
                                        f"{str(loaded.get('error'))[:300]}\n{out[-2000:]}"


@pytest.mark.parametrize("variant", sorted(REFUSED))
def test_doctor_does_not_call_step3_text_exports_vllm_refuses_healthy(judged, variant, capsys):
    """No row for Step3Text (its vLLM names are no checkpoint layout): on the NVFP4 exports vLLM 0.32 refuses
    (REFUSED), doctor says it has no loader profile and why the release's profile does not cover it, never "healthy"."""
    folder, loaded = judged["step3text", variant]
    assert not loaded["ok"], loaded
    code, out, err = run_captured(capsys, "doctor", "--target", TARGET, folder)
    assert code in (0, 1), err
    assert "no loader profile for Step3TextForCausalLM" in out, out
    assert "generated profile does not cover it (no checkpoint layout to learn" in out, out
    assert "healthy for this target" not in out, out


def test_fix_writes_what_vllm_loads_for_published_chatglm(judged, tmp_path, capsys):
    """Doctor's error on the published-name ChatGLM export with output_layer not excluded: fix adds the exclusion
    under the name vLLM matches, and vLLM 0.32 loads the output."""
    folder, loaded = judged["chatglm", "output_layer_not_excluded"]
    assert not loaded["ok"], loaded
    code, out, err = run_captured(capsys, "fix", "--target", TARGET, folder, "-o", tmp_path / "out")
    assert code == 0, out + err
    assert run_captured(capsys, "doctor", "--target", TARGET, tmp_path / "out")[0] == 0
    fixed = in_vllm("vllm_load.py", tmp_path / "out")[0]
    assert fixed["ok"], fixed
