"""Real NVIDIA ModelOpt NVFP4 exports of tiny models: the ground truth the test-suite checks ckpt-repair against.

Everything runs on CPU with nvidia-modelopt 0.47.0 / transformers 5.24.0 and no downloads: models are built from
configs in code and randomly initialised (deterministically per seed). modelopt and transformers are imported lazily
inside the functions because importing modelopt costs ~10 s.

What the exports contain (``export_modelopt``, tiny Gemma4AssistantForCausalLM, ``TINY`` dims):
  files: config.json (with ``quantization_config``), hf_quant_config.json, generation_config.json, model.safetensors.
  ``lm_head`` is tied to ``model.embed_tokens`` and is not written. Every quantized Linear ``X`` with weight [out, in] has
    X.weight uint8 [out, in/2]  X.weight_scale float8_e4m3fn [out, in/16]  X.weight_scale_2 float32 []
    X.input_scale float32 []    (input_scale only when ``calibrate=True``)
  quantized in both variants (weight -> packed shape / weight_scale shape):
    model.layers.0.self_attn.q_proj [64,64] -> [64,32]/[64,4]     model.layers.1.self_attn.q_proj [128,64] -> [128,32]/[128,4]
    model.layers.0.self_attn.o_proj [64,64] -> [64,32]/[64,4]     model.layers.1.self_attn.o_proj [64,128] -> [64,64]/[64,8]
    model.layers.{0,1}.mlp.gate_proj, up_proj [128,64] -> [128,32]/[128,4]; down_proj [64,128] -> [64,64]/[64,8]
    (gate_proj/up_proj share weight_scale_2 and input_scale: ModelOpt fuses siblings fed by the same input)
  bf16 in both variants: model.embed_tokens.weight [128,64], model.norm.weight [64], and per layer
    layer_scalar [1], self_attn.q_norm.weight [32] (layer 0) / [64] (layer 1), input_layernorm, post_attention_layernorm,
    pre_feedforward_layernorm, post_feedforward_layernorm .weight [64]. (No k_proj/v_proj: the assistant shares all KV.)
  broken (exclude_projections=False): pre_projection.weight uint8 [64,96] + weight_scale f8 [64,12] + weight_scale_2 [] (+input_scale),
    post_projection.weight uint8 [96,32] + weight_scale f8 [96,4] + weight_scale_2 [] (+input_scale);
    hf_quant_config.json quantization.exclude_modules == ["lm_head"], config.json quantization_config.ignore == ["lm_head"].
  correct (exclude_projections=True): pre_projection.weight bf16 [64,192], post_projection.weight bf16 [96,64], no scales;
    exclude_modules == ignore == ["lm_head", "post_projection", "pre_projection"].
  Both: quant_algo "NVFP4", group_size 16, kv_cache_quant_algo null, quant_method "modelopt", producer modelopt 0.47.0,
  config_groups.group_0 W4A4 (weights + input_activations, dynamic false, num_bits 4, type float, group_size 16,
  targets ["Linear"]) -- the W4A4 claim is written even when calibrate=False and no input_scale exists.
  Every tensor other than pre/post_projection is byte-identical between the two variants (also for unified=True and
  calibrate=False), and exports are byte-identical across runs and processes for the same seed and arguments.
  ordered_embeddings=True adds masked_embedding.token_ordering int64 [128] and masked_embedding.centroids, which
  NVFP4_DEFAULT_CFG quantizes too (uint8 [8,32], f8 [8,4], + scale_2/input_scale). CAVEAT: centroids reads the same
  hidden state as post_projection, so ModelOpt fuses them as siblings and in the broken export centroids gets
  post_projection's (larger) weight_scale_2; its weight/weight_scale/weight_scale_2 then differ between the variants.

Tiny Llama (``export_tiny_llama``): q/k/v/o/gate/up/down all packed (q/k/v share weight_scale_2 and input_scale),
  embed_tokens, lm_head (untied) and norms bf16; exclude_modules == ignore == ["lm_head", "model.embed_tokens"].

Tiny Qwen3 MoE (``export_tiny_qwen3_moe``, ``TINY_QWEN3_MOE``): attention as the Llama's (plus bf16 q_norm/k_norm), per
  expert model.layers.L.mlp.experts.N.{gate,up}_proj [32,64] -> uint8 [32,32], down_proj [64,32] -> uint8 [64,16];
  routers model.layers.L.mlp.gate.weight bf16 [4,64]; exclude_modules == ignore == ["lm_head", "model.embed_tokens",
  "model.layers.0.mlp.gate", "model.layers.1.mlp.gate"].
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

if TYPE_CHECKING:
    import transformers

# Tiny Gemma 4 assistant text config. Every Linear input dim is a multiple of 16 (NVFP4 block size). global_head_dim
# differs from head_dim so the full-attention layer's q_proj/o_proj/q_norm differ in shape from the sliding layer's.
TINY: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    global_head_dim=64,
    sliding_window=16,
    layer_types=["sliding_attention", "full_attention"],
    max_position_embeddings=128,
)
BACKBONE_HIDDEN = 96  # target model width: pre_projection [64, 2*96], post_projection [96, 64]
TINY_LLAMA: dict[str, Any] = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
)
TINY_QWEN3_MOE: dict[str, Any] = dict(
    TINY_LLAMA,
    head_dim=16,
    moe_intermediate_size=32,
    num_experts=4,
    num_experts_per_tok=2,
)
KV_LEN = 4  # length of the fake target-model KV the assistant attends to during calibration
# Harmless warnings emitted while importing modelopt: its transformers-version check, and torch.jit deprecations.
_IMPORT_NOISE = (r"transformers .* is not tested with current version of modelopt", r"`torch\.jit\.script(_method)?` is deprecated")


def _init_weights(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every persistent float tensor from a private generator, so the model is a pure function of seed.

    Matrices get N(0, 0.05) scaled per 16-block by a log-uniform factor in [1/4, 4] plus a few +-[0.3, 1) outliers, so
    NVFP4 block scales spread widely; 1-D tensors (norms, layer_scalar) get 1 + N(0, 0.1) so they are not all ones.
    """
    gen = torch.Generator().manual_seed(seed)
    seen: set[int] = set()
    with torch.no_grad():
        for name, t in model.state_dict(keep_vars=True).items():
            if not t.is_floating_point() or t.data_ptr() in seen:
                continue  # tied lm_head aliases embed_tokens; token_ordering is set elsewhere
            seen.add(t.data_ptr())
            if t.ndim == 1:
                t.copy_(1 + 0.1 * torch.randn(t.shape, generator=gen))
                continue
            cols = t.shape[-1]  # fused MoE experts [E, out, in] are initialised as E*out rows
            rows = t.numel() // cols
            w = 0.05 * torch.randn(rows, cols, generator=gen)
            w = w.view(rows, -1, 16) * torch.exp2(torch.rand(rows, cols // 16, 1, generator=gen) * 4 - 2)
            w = w.reshape(rows, cols)
            n_out = max(2, rows * cols // 512)
            idx = torch.randint(0, rows * cols, (n_out,), generator=gen)
            sign = torch.randint(0, 2, (n_out,), generator=gen) * 2 - 1
            w.view(-1)[idx] = sign * (0.3 + 0.7 * torch.rand(n_out, generator=gen))
            t.copy_(w.view(t.shape))


def build_tiny_assistant(
    seed: int = 0, *, unified: bool = False, ordered_embeddings: bool = False
) -> "transformers.PreTrainedModel":
    """Tiny random bf16 Gemma4(Unified)AssistantForCausalLM, deterministic per seed, with config.architectures set
    (ModelOpt's export needs it). ordered_embeddings adds the centroid masked embedder (8 centroids, top-k 4)."""
    import transformers as tf

    text = dict(TINY)
    if unified:
        cfg_cls, model_cls, text_type = tf.Gemma4UnifiedAssistantConfig, tf.Gemma4UnifiedAssistantForCausalLM, "gemma4_unified_text"
    else:
        cfg_cls, model_cls, text_type = tf.Gemma4AssistantConfig, tf.Gemma4AssistantForCausalLM, "gemma4_text"
        text.update(hidden_size_per_layer_input=0, vocab_size_per_layer_input=0)  # the assistant config demands 0
    config = cfg_cls(
        text_config=dict(text, model_type=text_type),
        backbone_hidden_size=BACKBONE_HIDDEN,
        use_ordered_embeddings=ordered_embeddings,
        num_centroids=8,
        centroid_intermediate_top_k=4,
        architectures=[model_cls.__name__],
        dtype="bfloat16",
    )
    model = model_cls(config)
    _init_weights(model, seed)
    if ordered_embeddings:
        gen = torch.Generator().manual_seed(seed + 1)
        model.masked_embedding.token_ordering.copy_(torch.randperm(TINY["vocab_size"], generator=gen))
    return model.to(torch.bfloat16).eval()


def assistant_inputs(model: torch.nn.Module, gen: torch.Generator) -> dict[str, Any]:
    """One seq-len-1 assistant step: inputs_embeds [1,1,2*backbone], fake target KV per layer type, position_ids.
    seq_len must be 1: with more, transformers 5.24 slices KV-shared inputs and fails on per_layer_inputs=None."""
    bf = lambda *shape: torch.randn(*shape, generator=gen).to(torch.bfloat16)  # noqa: E731
    kv: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    n_heads = model.config.get_text_config().num_attention_heads
    for layer in model.model.layers:
        attn = layer.self_attn
        shape = (1, n_heads // attn.num_key_value_groups, KV_LEN, attn.head_dim)
        kv[attn.layer_type] = (bf(*shape), bf(*shape))
    return dict(inputs_embeds=bf(1, 1, 2 * model.config.backbone_hidden_size), shared_kv_states=kv,
                position_ids=torch.tensor([[KV_LEN]]))


def _modelopt() -> tuple[Any, Callable, type]:
    """Lazy import (~10 s) of (mtq, export_hf_checkpoint, NVFP4QTensor), silencing only the known import noise."""
    with warnings.catch_warnings():
        for message in _IMPORT_NOISE:
            warnings.filterwarnings("ignore", message=message)
        import modelopt.torch.quantization as mtq
        from modelopt.torch.export import export_hf_checkpoint
        from modelopt.torch.quantization.qtensor import NVFP4QTensor
    return mtq, export_hf_checkpoint, NVFP4QTensor


def _quantize_and_export(model: torch.nn.Module, out_dir: Path, quant_cfg: dict, forward_loop: Callable | None) -> Path:
    """mtq.quantize (max calibration when forward_loop is given) then export_hf_checkpoint into out_dir."""
    mtq, export_hf_checkpoint, _ = _modelopt()
    model = mtq.quantize(model, quant_cfg, forward_loop)
    out_dir = Path(out_dir)
    with torch.inference_mode():
        export_hf_checkpoint(model, export_dir=out_dir)
    return out_dir


def _nvfp4_cfg(disabled: list[str]) -> dict:
    """Deep copy of NVFP4_DEFAULT_CFG (never mutate modelopt's global) with extra quantizer patterns disabled."""
    cfg = copy.deepcopy(_modelopt()[0].NVFP4_DEFAULT_CFG)
    cfg["quant_cfg"] += [{"quantizer_name": pat, "enable": False} for pat in disabled]  # later entries win
    return cfg


def save_original(out_dir: Path, seed: int = 0, **kw: Any) -> Path:
    """save_pretrained (safetensors, bf16, tied lm_head omitted) of exactly the model the exports quantize."""
    out_dir = Path(out_dir)
    build_tiny_assistant(seed, **kw).save_pretrained(out_dir)
    return out_dir


def export_modelopt(
    out_dir: Path, *, exclude_projections: bool, seed: int = 0, calibrate: bool = True, **kw: Any
) -> Path:
    """ModelOpt NVFP4 export of build_tiny_assistant(seed, **kw).

    exclude_projections=False reproduces the bug (pre/post_projection packed to NVFP4, because NVFP4_DEFAULT_CFG
    quantizes every Linear but lm_head); True disables '*pre_projection*'/'*post_projection*' like a correct export.
    calibrate=True runs max calibration on CPU over 4 seeded seq-len-1 steps, so input_scale tensors are written
    (calibration works on CPU; only fake-quant inference after quantize does not). calibrate=False is weight-only
    (forward_loop=None): no input_scale. ModelOpt's export does its own dummy forward to find sibling Linears sharing an
    input; the assistant's forward needs inputs_embeds + shared_kv_states, so model.get_dummy_inputs is provided.
    """
    model = build_tiny_assistant(seed, **kw)
    dummy = assistant_inputs(model, torch.Generator().manual_seed(seed + 2))
    model.get_dummy_inputs = lambda: dummy
    batches = [assistant_inputs(model, torch.Generator().manual_seed(seed + 3 + i)) for i in range(4)]

    def forward_loop(m: torch.nn.Module) -> None:
        for batch in batches:
            m(**batch)

    disabled = ["*pre_projection*", "*post_projection*"] if exclude_projections else []
    return _quantize_and_export(model, out_dir, _nvfp4_cfg(disabled), forward_loop if calibrate else None)


def _build_tiny_causal_lm(config_cls: str, model_cls: str, dims: dict[str, Any], seed: int) -> "transformers.PreTrainedModel":
    """Tiny random bf16 transformers causal LM (untied lm_head), deterministic per seed."""
    import transformers as tf

    config = getattr(tf, config_cls)(**dims, architectures=[model_cls], dtype="bfloat16")
    model = getattr(tf, model_cls)(config)
    _init_weights(model, seed)
    return model.to(torch.bfloat16).eval()


def _build_tiny_llama(seed: int) -> "transformers.PreTrainedModel":
    """Tiny random bf16 LlamaForCausalLM (untied lm_head), the plain-decoder control case."""
    return _build_tiny_causal_lm("LlamaConfig", "LlamaForCausalLM", TINY_LLAMA, seed)


def save_tiny_llama_original(out_dir: Path, seed: int = 0) -> Path:
    """BF16 original of export_tiny_llama(seed)."""
    out_dir = Path(out_dir)
    _build_tiny_llama(seed).save_pretrained(out_dir)
    return out_dir


def save_tiny_causal_lm_original(config_cls: str, model_cls: str, dims: dict[str, Any], out_dir: Path, seed: int = 0) -> Path:
    """BF16 original (transformers' save_pretrained, its checkpoint names) of export_tiny_causal_lm(...)."""
    out_dir = Path(out_dir)
    _build_tiny_causal_lm(config_cls, model_cls, dims, seed).save_pretrained(out_dir)
    return out_dir


def export_tiny_causal_lm(config_cls: str, model_cls: str, dims: dict[str, Any], out_dir: Path, seed: int = 0) -> Path:
    """ModelOpt NVFP4 export (calibrated as export_tiny_llama) of a tiny transformers causal LM."""
    return _export_causal_lm(_build_tiny_causal_lm(config_cls, model_cls, dims, seed), out_dir, seed)


def _export_causal_lm(model: torch.nn.Module, out_dir: Path, seed: int, quant_cfg: dict | None = None) -> Path:
    """ModelOpt export (NVFP4_DEFAULT_CFG unless `quant_cfg`, calibrated on 4 seeded 8-token prompts) of a tiny causal LM."""
    gen = torch.Generator().manual_seed(seed + 3)
    prompts = [torch.randint(0, model.config.vocab_size, (1, 8), generator=gen) for _ in range(4)]

    def forward_loop(m: torch.nn.Module) -> None:
        for ids in prompts:
            m(input_ids=ids)

    return _quantize_and_export(model, out_dir, quant_cfg or _nvfp4_cfg([]), forward_loop)


def export_tiny_llama_fp8(out_dir: Path, seed: int = 0) -> Path:
    """ModelOpt FP8 per-tensor export (FP8_DEFAULT_CFG, calibrated as export_tiny_llama) of the tiny Llama: its export
    fuses no FP8 group, so q/k/v and gate/up each keep their own weight_scale."""
    return _export_causal_lm(_build_tiny_llama(seed), out_dir, seed, copy.deepcopy(_modelopt()[0].FP8_DEFAULT_CFG))


def shared_input_groups(config_cls: str, model_cls: str, dims: dict[str, Any]) -> list[list[str]]:
    """The groups of quantized linears ModelOpt's own HF export fuses in a tiny random model (NVFP4_DEFAULT_CFG): its
    `collect_shared_input_modules` over the dummy forward requantize_resmooth_fused_llm_layers runs (input ids [1, 2])."""
    mtq = _modelopt()[0]
    from modelopt.torch.export.unified_export_hf import collect_shared_input_modules

    model = mtq.quantize(_build_tiny_causal_lm(config_cls, model_cls, dims, 0), _nvfp4_cfg([]), None)
    groups, _ = collect_shared_input_modules(model, lambda: model(torch.ones([1, 2], dtype=torch.long)))
    return [[m.name for m in modules] for modules in groups.values() if len(modules) > 1]


def export_tiny_llama(out_dir: Path, seed: int = 0) -> Path:
    """ModelOpt NVFP4 export (calibrated on 4 seeded 8-token prompts) of the tiny Llama."""
    return _export_causal_lm(_build_tiny_llama(seed), out_dir, seed)


def export_tiny_qwen3_moe(out_dir: Path, seed: int = 0) -> Path:
    """ModelOpt NVFP4 export of a tiny Qwen3MoeForCausalLM (4 experts, top 2, every layer sparse). transformers keeps
    the experts fused ([E, 2*I, H] gate_up_proj); ModelOpt writes them per expert (experts.N.{gate,up,down}_proj) and
    excludes the routers (model.layers.N.mlp.gate) itself."""
    return _export_causal_lm(_build_tiny_causal_lm("Qwen3MoeConfig", "Qwen3MoeForCausalLM", TINY_QWEN3_MOE, seed),
                             out_dir, seed)


def modelopt_dequantize(
    packed: torch.Tensor,
    weight_scale: torch.Tensor,
    weight_scale_2: torch.Tensor,
    dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """ModelOpt's own NVFP4QTensor.dequantize (pure-torch fast=False path): the oracle for our codec."""
    cls = _modelopt()[2]
    shape = torch.Size((*packed.shape[:-1], packed.shape[-1] * 2))
    qt = cls(shape, dtype, packed)
    return qt.dequantize(dtype=dtype, fast=False, scale=weight_scale, double_scale=weight_scale_2, block_sizes={-1: 16})


def modelopt_quantize(
    weight: torch.Tensor, weight_scale_2: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """ModelOpt's NVFP4QTensor.quantize(weight, 16): (packed uint8, fp8 block scales, fp32 0-d weight_scale_2).
    Pass the exported weight_scale_2 to reproduce fused siblings, which share the group's max."""
    cls = _modelopt()[2]
    qt, scale, scale_2 = cls.quantize(weight, 16, weights_scaling_factor_2=weight_scale_2)
    return qt._quantized_data, scale, scale_2.float().reshape(())
