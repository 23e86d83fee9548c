"""DeepSeek-V4's own `fp8` form (nvidia/DeepSeek-V4-Flash-NVFP4 as published), read as vLLM 0.32 reads it.

config.json's quantization_config says `quant_method: fp8` (with `weight_block_size`, `scale_fmt: ue8m0` and, on
NVIDIA's export, `moe_quant_algo: NVFP4`); on model_type deepseek_v4 vLLM 0.32 builds it as `DeepseekV4FP8Config`
(models/deepseek_v4/quant_config.py:139-157):
  * every linear layer built with the quant config is FP8 block (Fp8LinearMethod: float8_e4m3fn weight, a scale per
    128x128 block registered as `weight_scale_inv`, float8_e8m0fnu when `expert_dtype` is fp4: quant_config.py:80-84,
    fp8.py:329-339); the checkpoint stores it as DeepSeek's `.scale` (nvidia/model.py:1718-1724 maps it), in e8m0 or
    float32 (a float32 power of two copies into the e8m0 parameter exactly, any other is rounded: doctor says so);
  * routed experts are ModelOpt NVFP4 when `moe_quant_algo` is NVFP4 and expert_dtype fp4 (:186-195, a
    ModelOptNvFp4Config with no exclusions), MXFP4 without it (:196), FP8 block for expert_dtype fp8 (:197-199);
  * exclusions are Fp8Config's `ignored_layers` (else `modules_to_not_convert`), matched exactly, a fused layer by its
    own name first and then by every shard, an expert by an entry naming experts that holds it (quant_utils.py:617-
    690); the `ignore` and `quantized_layers` ModelOpt also wrote there are keys this config never reads (fp8.py:158-175).
fix edits the list vLLM reads (`ignored_layers`) for a layer stored BF16 where vLLM builds FP8 block (its bytes are
copied); it writes no FP8 block weight, so dequantizing or requantizing one is refused in one line, as are --original
and --tp (`UNSUPPORTED`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Iterable

from repair.errors import BadInput
from repair.formats import nvfp4_packed
from repair.formats.base import Covers, Declaration, routed_layer
from repair.io.checkpoint import CONFIG, Checkpoint
from repair.io.safetensors import TensorInfo
from repair.formats.modules import StoredModule

NAME = "deepseek_v4_fp8"
METHODS = ("fp8", NAME)  # quant_config.py:149-153: the quant_methods DeepseekV4FP8Config takes over on deepseek_v4
LEAVES = {"weight": "weight", "weight_scale": "weight_scale", "weight_scale_2": "weight_scale_2", "input_scale": "input_scale"}
BLOCK_SCALES = ("scale", "weight_scale_inv")  # DeepSeek's name, and the one vLLM's mapper gives it
EXPERT_DTYPES = ("fp4", "fp8")  # quant_config.py:21, refused otherwise with vLLM's own words (:67-71)
WRITES = "this tool writes no FP8 block weights"
UNSUPPORTED = {"requantize": f"{WRITES}, and requantizes NVFP4 into ModelOpt's own formats only",
               "original": "--original verifies modules requantized with ModelOpt's math; this form's FP8 block layers are "
                           "DeepSeek's own",
               "tp": "--tp reshards ModelOpt checkpoints only; run without --tp"}


FUSED_REFUSAL = ("Detected some but not all shards of {prefix} are quantized. All shards of fused layers "
                 "to have the same precision.")  # quant_utils.py:676-681


@dataclass(frozen=True)
class ExactRule:
    """Fp8Config's `exact` is_layer_skipped over one list (quant_utils.py:617-690). vLLM compares entry and layer in
    its own spelling: the list is mapped with the class's mapper first (Fp8Config.apply_vllm_mapper, fp8.py:153-155),
    which a vLLM target's binding does from the release's data (targets/entry_mappers.py: `layers.1.attn.wq_b` and
    `model.layers.1.attn.wq_b` name the same layer), so this rule compares the names it is given."""

    entries: frozenset[str]

    def excludes(self, prefix: str) -> bool:
        """An expert is asked as its routed-experts layer (`...ffn.experts`, the prefix vLLM's FusedMoE hands the
        config: fused_moe/layer.py:227); a prefix holding `experts` (the shared experts' down_proj too) is skipped when
        an entry naming experts holds it (quant_utils.py:682-686); any other layer by equality."""
        return bool(self._hits(prefix))

    def shard_excluded(self, prefix: str) -> bool:
        return prefix in self.entries

    def _hits(self, prefix: str) -> list[str]:
        asked = routed_layer(prefix)
        if "experts" in asked:
            return [e for e in self.entries if "experts" in e and asked in e]
        return [asked] if asked in self.entries else []

    def used_entries(self, prefixes: Iterable[str]) -> frozenset[str]:
        return frozenset(e for p in prefixes for e in self._hits(p))

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        """vLLM's error when the fused name is not listed and its shards disagree, on the prefix it builds."""
        if self.shard_excluded(fused) or len({self.shard_excluded(s) for s in shards}) < 2:
            return None
        return FUSED_REFUSAL.format(prefix=fused)


@dataclass(frozen=True)
class Schemes:
    """What DeepseekV4FP8Config builds each quantized layer as: routed experts by expert_dtype / moe_quant_algo, every
    other layer FP8 block. (`targets`: the shape Declaration.group_algos users read.)"""

    experts: str
    targets: tuple[tuple[str, str], ...] = ()

    def resolve(self, prefix: str, packed=None) -> str:
        return self.experts if ".experts" in prefix else "FP8_BLOCK"

    def ordered(self, order: tuple[str, ...]) -> "Schemes":
        """No config-group targets to try in another runtime's order: the same schemes."""
        return self

    @property
    def algorithms(self) -> frozenset[str]:
        return frozenset({self.experts, "FP8_BLOCK"})


def read_key(quant_cfg: dict) -> str:
    """The exclusion key Fp8Config.from_config reads: `ignored_layers`, else (it empty) `modules_to_not_convert`
    (fp8.py:162-167)."""
    if not quant_cfg.get("ignored_layers") and quant_cfg.get("modules_to_not_convert"):
        return "modules_to_not_convert"
    return "ignored_layers"


def claims(ckpt: Checkpoint) -> bool:
    """quant_config.py:139-157: quant_method fp8 (or deepseek_v4_fp8) on model_type deepseek_v4."""
    config = ckpt.config or {}
    quant_cfg = config.get("quantization_config")
    return isinstance(quant_cfg, dict) and quant_cfg.get("quant_method") in METHODS and config.get("model_type") == "deepseek_v4"


def read_declaration(ckpt: Checkpoint) -> Declaration:
    """The per-layer schemes and the exclusion list vLLM 0.32 reads; a form it builds that this tool does not read
    (MXFP4 experts, no block size) is refused in one line."""
    path = ckpt.root / CONFIG
    config = ckpt.config or {}
    quant_cfg = config["quantization_config"]
    expert_dtype = config.get("expert_dtype", "fp4")
    if expert_dtype not in EXPERT_DTYPES:
        raise BadInput(f"{path}: Unsupported DeepSeek V4 expert_dtype={expert_dtype!r}; expected one of {EXPERT_DTYPES}. "
                       "(vLLM 0.32 stops there too); fix config.json")
    if quant_cfg.get("weight_block_size") != [128, 128]:
        raise BadInput(f"{path}: quantization_config.weight_block_size {quant_cfg.get('weight_block_size')!r} is not DeepSeek-V4's "
                       "[128, 128]; this tool reads FP8 block 128x128 linears only")
    algo = quant_cfg.get("moe_quant_algo")
    algo = algo.upper() if isinstance(algo, str) and algo else None  # quant_config.py:93-95
    if expert_dtype == "fp8":
        experts = "FP8_BLOCK"
    elif algo == "NVFP4":
        experts = "NVFP4"
    else:
        raise BadInput(f"{path}: expert_dtype fp4 with moe_quant_algo {algo!r}: vLLM 0.32 builds the routed experts as MXFP4 "
                       "(Mxfp4MoEMethod), a format this tool does not read; it reads the NVFP4 experts of moe_quant_algo "
                       "\"NVFP4\"")
    key = read_key(quant_cfg)
    ignore = nvfp4_packed.name_list(quant_cfg.get(key), path, f"quantization_config.{key}")
    scale_dtype = "F8_E8M0" if expert_dtype == "fp4" else "F32"  # is_scale_e8m0 (quant_config.py:80-84, fp8.py:336)
    return Declaration("FP8_BLOCK", ignore, None, DEEPSEEK_V4_FP8, group_algos=Schemes(experts), block_scale_dtype=scale_dtype)


def group_modules(infos: dict[str, TensorInfo]) -> list[StoredModule]:
    """ModelOpt's grouping, with DeepSeek's block scale (`X.scale`, or `X.weight_scale_inv`) beside a float8 weight
    playing `weight_scale`: read as FP8 block when shaped [ceil(out/128), ceil(in/128)] in float32 or e8m0."""
    aliased = dict(infos)
    for name, info in infos.items():
        module, _, leaf = name.rpartition(".")
        weight = infos.get(f"{module}.weight")
        if leaf in BLOCK_SCALES and weight is not None and weight.dtype == "F8_E4M3" and f"{module}.weight_scale" not in infos:
            del aliased[name]
            aliased[f"{module}.weight_scale"] = info
    return nvfp4_packed.group_modules(aliased, LEAVES)


class DeepseekV4Fp8(nvfp4_packed.PackedNvfp4):
    """DeepSeek-V4's `fp8` form: FP8 block linears beside ModelOpt NVFP4 (or FP8 block) routed experts."""

    NAME = NAME
    GLOBAL_SCALE_IS_DIVISOR = False  # the experts' ModelOpt NVFP4: value = fp4 * weight_scale * weight_scale_2
    LEAVES = LEAVES
    RUNTIME_LEAVES = {"weight": "weight", "weight_scale": "weight_scale", "weight_scale_2": "weight_scale_2",
                      "input_scale": "input_scale", "scale": "weight_scale", "weight_scale_inv": "weight_scale"}
    UNSUPPORTED = UNSUPPORTED
    NEEDS_LAYER_ROWS = True  # "every linear built with the quant config": embed, head, gate, compressors are not
    FUSED_REFUSAL = FUSED_REFUSAL
    ENTRY_MAPPING = "every"  # Fp8Config.apply_vllm_mapper (fp8.py:153-155), which DeepseekV4FP8Config inherits

    def claims(self, ckpt: Checkpoint) -> bool:
        return claims(ckpt)

    def group_modules(self, infos: dict[str, TensorInfo]) -> list[StoredModule]:
        return group_modules(infos)

    def rule(self, exclusions: tuple[str, ...] | list[str], targets: tuple[str, ...] | None) -> ExactRule:
        return ExactRule(frozenset(exclusions))

    def exclusion_entry(self, module: str) -> str:
        return module

    def with_exclusions(self, ckpt: Checkpoint, names: list[str], covers: Covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]:
        """config.json whose list vLLM reads covers `names` (a layer stored BF16 is built unquantized, its bytes
        untouched); hf_quant_config.json is no declaration vLLM reads for this form, so it is kept as it is."""
        config = copy.deepcopy(ckpt.config)
        quant_cfg = config["quantization_config"]
        key = read_key(quant_cfg)
        kept = [n for n in quant_cfg.get(key) or [] if n not in remove]
        quant_cfg[key] = nvfp4_packed.append_missing(kept, names, covers)
        return config, ckpt.hf_quant_config

    def exclusion_lists(self, config: dict | None, hf_quant: dict | None) -> list[list[str]]:
        quant_cfg = (config or {}).get("quantization_config")
        return [list(quant_cfg.get(read_key(quant_cfg)) or [])] if isinstance(quant_cfg, dict) else []

    def without_entries(self, config: dict | None, hf_quant: dict | None, entries: frozenset[str]) -> tuple[dict | None, dict | None]:
        config = copy.deepcopy(config)
        quant_cfg = (config or {}).get("quantization_config")
        if isinstance(quant_cfg, dict) and isinstance(quant_cfg.get(read_key(quant_cfg)), list):
            quant_cfg[read_key(quant_cfg)] = [e for e in quant_cfg[read_key(quant_cfg)] if e not in entries]
        return config, hf_quant

    read_declaration = staticmethod(read_declaration)


DEEPSEEK_V4_FP8 = DeepseekV4Fp8()
