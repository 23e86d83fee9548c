"""DeepSeek-V4's published `fp8` form (quant_method fp8 + moe_quant_algo NVFP4) as SGLang 0.5.23 reads it.

SGLang detects the form from config.json (model_config.py:775-794: quant_algo MIXED_PRECISION, moe_quant_algo NVFP4
and a group_size make `nvfp4_moe_meta`, its exclusions the config's `ignore`), builds Fp8Config from quant_method fp8
and wraps it (model_loader/loader.py:222-247) in HybridFp8NvFp4Config with a ModelOptFp4Config whose exclude_modules
are `ignore` + ["model.decoder.*", "stages.*"]. A FusedMoE is NVFP4 unless that config's is_layer_excluded names it
(modelopt_quant.py:1747-1763; else MXFP4 or Fp8Config's MoE); every other layer is Fp8Config's: a Linear is FP8 block
unless is_layer_skipped finds it in `ignored_layers` (else `modules_to_not_convert`, each with and without `model.`:
fp8.py:346-364, 396-407). The model builds its compressors, the indexer's weights_proj, the router, embedding and
head without the quant config (deepseek_v4.py:1449-1476, indexer.py:1186-1198). SGLang asks all of it under its own
layer names (`model.layers.N.self_attn.wqkv_a`, `model.layers.N.mlp.experts`: the rules file's `built_layers`).

That is the declaration's own reading (every asked Linear FP8 block, routed experts NVFP4: formats/deepseek_v4_fp8.py)
when SGLang makes nvfp4_moe_meta with int(group_size) 16, its `ignore` excludes no routed-experts layer under
SGLang's name, and the list Fp8Config reads is empty; doctor judges those. Any other config is refused in one line: SGLang builds its experts
otherwise (not a form this tool reads), or matches list entries against its own layer names, which the checkpoint's
names are not (an entry naming `layers.1.attn.wq_b` never meets SGLang's `model.layers.1.self_attn.wq_b`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from repair.arch.resolved import shown
from repair.targets.sglang_match import ExcludedGlobs

ADDED_EXCLUSIONS = ("model.decoder.*", "stages.*")  # model_loader/loader.py:236-239: draft experts stay MXFP4
NVFP4_GROUP = 16  # the experts' grouping the declaration's NVFP4 reads
FP8_LISTS = ("ignored_layers", "modules_to_not_convert")  # fp8.py:354-356, the first one present


@dataclass(frozen=True)
class NothingExcluded:
    """Fp8Config's is_layer_skipped over an empty list, and no routed experts excluded: what the refusal leaves."""

    def excludes(self, prefix: str) -> bool:
        return False

    def shard_excluded(self, prefix: str) -> bool:
        return False

    def fused_refusal(self, fused: str, shards: tuple[str, ...]) -> str | None:
        return None

    def used_entries(self, prefixes: Iterable[str]) -> frozenset[str]:
        return frozenset()


def hybrid(entries: tuple[str, ...], targets, building) -> NothingExcluded:
    """The exclusion matcher (`sglang_dsv4_fp8_hybrid`): bound only after `refusal` found no list it reads non-empty."""
    return NothingExcluded()


def unread_entries(who: str) -> str:
    """Why fix writes no exclusion for this form: any entry is refused above, and SGLang would not read it anyway."""
    return (f"fix --target cannot exclude it for {who}, which matches the exclusion lists against its own layer names "
            "(fp8.py:354-364, `model.layers.N.self_attn.wq_b`), not the checkpoint's")


def refusal(config: dict | None, built_layers: Mapping[str, str], who: str) -> str | None:
    """Why SGLang's reading of this config is not the one doctor judges (None: it is); `built_layers`: the release's
    own layer names of the class (`*` a layer number) and their classes."""
    quant = (config or {}).get("quantization_config")
    quant = quant if isinstance(quant, dict) else {}
    if not (str(quant.get("quant_algo", "")).upper() == "MIXED_PRECISION" and str(quant.get("moe_quant_algo", "")).upper()
            == "NVFP4" and quant.get("group_size") is not None):
        return (f"{who} builds its NVFP4 experts from this form only where quantization_config says quant_algo "
                "MIXED_PRECISION, moe_quant_algo NVFP4 and a group_size (model_config.py:775-794); otherwise its Fp8Config "
                "builds the routed experts FP8 or MXFP4, a form this tool does not read")
    try:  # model_config.py:786 `int(group_size)`, the experts' ModelOptFp4Config's grouping (loader.py:243)
        group = int(quant["group_size"])
    except (TypeError, ValueError, OverflowError):
        return (f"{who} reads quantization_config.group_size with int() (model_config.py:786), and "
                f"{shown(repr(quant['group_size']))} is not a whole number: it stops reading the config")
    if group != NVFP4_GROUP:
        return (f"{who} builds its NVFP4 experts with group_size {group} (int() of the config's, model_config.py:786; "
                f"loader.py:243), a form this tool does not read (NVFP4's {NVFP4_GROUP})")
    key = next((k for k in FP8_LISTS if k in quant), None)
    if key is not None and quant[key]:
        return (f"{who} matches quantization_config.{key} against its own layer names (fp8.py:354-364, is_layer_skipped: "
                "`model.layers.N.self_attn.wq_b` for the checkpoint's `layers.N.attn.wq_b`), which this tool does not hold "
                "for this form")
    ignore = quant.get("ignore") or []
    if not isinstance(ignore, list) or not all(isinstance(e, str) for e in ignore):
        return f"{who} reads quantization_config.ignore as a list of names (model_config.py:787), and it is not one"
    excluded = ExcludedGlobs.compile((*ignore, *ADDED_EXCLUSIONS))
    depth = (config or {}).get("num_hidden_layers")
    depth = depth if type(depth) is int and 0 < depth <= 4096 else 0
    for pattern in (p for p, cls in built_layers.items() if cls == "FusedMoE"):
        named = next((pattern.replace("*", str(i)) for i in range(depth) if excluded(pattern.replace("*", str(i)))), None)
        if named is not None:
            return (f"{who} excludes its routed experts {named} from NVFP4 by quantization_config.ignore "
                    "(modelopt_quant.py:1752-1762) and builds them MXFP4 or FP8, a form this tool does not read")
    return None
