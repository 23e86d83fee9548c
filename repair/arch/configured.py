"""A profiled row as the release builds it for one config.json, when the row records two builds (the profile's `without`).

vLLM 0.32 builds Qwen4Exp's QSA attention only when the `indexer_*` fields are set (qwen4_exp/nvidia/model.py:243).
All null: the build without QSA. Some null, or set to values transformers' Qwen4ExpConfig validation does not take
(which vLLM runs while reading config.json): the release refuses the config before building any layer. Those refusals
are recorded from vLLM's own config loading by tools/vllm_config_refusals.py (`partly_null_refused`: each proper subset
of null fields; `value_refused`: the value rules it enforces, in its validator's order, with its words), so each is
quoted, never composed here.
"""

from __future__ import annotations

from repair.arch.layer_rules import text_part
from repair.arch.variants import varied

SHOWN = 40  # characters of a config value a message shows


def as_configured(entry: dict | None, config: dict | None) -> dict | None:
    """The entry as vLLM builds the model for `config`: a recorded variant's modules and fused layers where its
    condition holds (arch/variants.py: DeepSeek-V2 with q_lora_rank null); its `without` modules (Qwen4Exp without indexer_*: no QSA,
    q/k/v quantized) when every field that build lacks is absent or null in the config's text part, with what its
    load_weights raises on (`refused_only_with`: QSA's indexer); else as profiled, with the modules only that build
    loads (`loads_only_with`) and how the release refuses the config where it does (`config_refused`: {"fields",
    "problem", "remedy", "error"}, the error None where the profile records no text for it)."""
    entry = varied(entry, config)
    without = (entry or {}).get("without")
    if not without or config is None:
        return entry
    part, fields = text_part(config), without["fields"]
    null = [f for f in fields if part.get(f) is None]
    if len(null) == len(fields):
        return {**entry, "modules": without["modules"], "refused_only_with": without.get("refused_only_with", {})}
    # the refusals were recorded for integer values (the probes'); another type stops the validator's type check first
    typed = all(_integer(part[f]) for f in fields if part.get(f) is not None)
    refusal = (null_refusal(without, null) if null else value_refusal(without.get("value_refused", ()), part)) if typed else None
    return {**entry, "loads_only_with": without.get("loads_only_with", []), **({"config_refused": refusal} if refusal else {})}


def null_refusal(without: dict, null: list[str]) -> dict | None:
    """The release's refusal of a config with these fields of the build null and the others set: its words where the
    profile records these exactly; None where it records no refusal for some field alone (it takes such configs)."""
    recorded = without.get("partly_null_refused", {})
    if ",".join(null) not in recorded and not set(null) <= set(recorded):
        return None
    return {"fields": null, "problem": "null in config.json while other fields of the same build are set",
            "remedy": f"set every one of {', '.join(without['fields'])}, or leave them all null",
            "error": recorded.get(",".join(null))}


def value_refusal(rules, part: dict) -> dict | None:
    """The first recorded value rule the config's values break (the release's validator stops at the first), None when
    they break none. A config where some field a rule reads is no integer is judged by no rule: the validator's type
    checks (which may stop it first) are not recorded."""
    rules = [r for r in rules if isinstance(r, dict)] if isinstance(rules, (list, tuple)) else []
    read = [r.get(k) for r in rules for k in ("field", "multiple_of")]
    if not all(_integer(part.get(f)) for f in read if isinstance(f, str)):
        return None
    for rule in rules:
        field = rule.get("field")
        value = part.get(field) if isinstance(field, str) else None
        broken = _broken(rule, value, part) if _integer(value) else None
        if broken:
            return {"fields": [field], "problem": f"{_shown(value)} in config.json, {broken}",
                    "remedy": f"set {field} to the value the model was trained with (its original config.json), which "
                              "this validation takes", "error": rule.get("error")}
    return None


def _broken(rule: dict, value: int, part: dict) -> str | None:
    """How `value` breaks the rule (as a message says it), None when it keeps it or the rule is of no known form."""
    if _integer(rule.get("at_least")) and value < rule["at_least"]:
        return f"below {rule['at_least']}"
    if _integer(rule.get("equals")) and value != rule["equals"]:
        return f"where only {rule['equals']} is taken"
    of = rule.get("multiple_of")
    other = part.get(of) if isinstance(of, str) else None
    if _integer(other) and other > 0 and value % other:
        return f"not a multiple of {of} ({_shown(other)})"
    return None


def _integer(value) -> bool:
    return type(value) is int


def _shown(value: int) -> str:
    text = str(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} digits)"


def disagreement(entry: dict | None, config: dict | None) -> str | None:
    """Why a learned row does not describe this config, None when it does: config.json sets a field the row's build
    read with a default (`config.agrees_with`, tools/vllm_remote_configs.py) to another value, and vLLM builds other
    layers for another value (MiniCPM's num_experts: 0 builds the dense MLP, 8 the MoE with an unquantized router),
    unless the profile records that other build (`variants`, arch/variants.py)."""
    agreed = ((varied(entry, config) or {}).get("config") or {}).get("agrees_with") or {}
    part = text_part(config) if config is not None else {}
    for field, value in sorted(agreed.items()):
        if field in part and part[field] != value:
            return (f"its row was learned where vLLM's model code read {field} = {value!r} by default, which chose the "
                    f"layers it builds; config.json sets {field} = {part[field]!r}")
    return None

