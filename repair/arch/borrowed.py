"""A generated row as another runtime borrows it (SGLang, TensorRT-LLM rules files take vLLM's layer roles): without
what only vLLM's own quant-config code decides about a layer."""

from __future__ import annotations


def quantizable(entry: dict) -> dict:
    """The row without vLLM's ModelOpt-FP4-only refusals (`modelopt_fp4_only`, of the main model and its drafter):
    vLLM's own quant config declines those layers, the same code quantizes them under another config, so another
    runtime's rules decide them (SGLang 0.5.23 builds Gemma 4's vision encoder NVFP4, vLLM 0.32 BF16)."""
    def part(p: dict) -> dict:
        only = set(p.get("modelopt_fp4_only", ()))
        modules = {k: dict(v, state="quantized") if k in only else v for k, v in p.get("modules", {}).items()}
        return {k: v for k, v in p.items() if k != "modelopt_fp4_only"} | ({"modules": modules} if "modules" in p else {})
    out = part(entry)
    return out | ({"mtp": part(entry["mtp"])} if isinstance(entry.get("mtp"), dict) else {})


def borrowed_entry(entry: dict, own_code: frozenset[str], routed_experts: str) -> dict:
    """`entry` without the facts only vLLM's code says (profiled.py OWN_CODE, its ModelOpt-FP4-only refusals), but
    the prefix of routed experts, which each runtime's model asks about under its `experts` module."""
    moe = {k: v for k, v in entry.get("prefixes", {}).items() if v.endswith(routed_experts)}
    return {k: v for k, v in quantizable(entry).items() if k not in own_code} | ({"prefixes": moe} if moe else {})
