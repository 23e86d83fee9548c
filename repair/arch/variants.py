"""A profiled row's facts that depend on one config.json field (the profile's `variants`, and `build_refused`'s `unless`).

The generator builds each class from one small config; where another value of a field builds other layers, it builds
the model again with the field varied and records that build's modules and fused layers with the condition
(tools/vllm_variants.py): vLLM 0.32's DeepSeek-V2 builds kv_a_proj_with_mqa as a layer of its own, not as a shard of
fused_qkv_a_proj, where q_lora_rank is null (DeepSeek-V2-Lite); MiniCPM builds an MoE with an unquantized router where
num_experts is not 0. A build refusal may be lifted the same way: vLLM 0.28 builds DeepSeek-V4's attention where
config.json declares an FP8 KV cache. A condition:
  {"field": F, "is": V}          F is set to V (null included; absent is the config class's default, not V);
  {"field": F, "other_than": V}  F is set to a value of V's type (an int: not a bool) other than V;
  {"field": F, "includes": V}    F is an object holding V's keys, numbers compared by value (8.0 is 8), others as `is`;
  {"field": F, "any_case": V}    F is a string equal to V but for case; {"field": F, "starts_with": V}: one starting so.
The wider forms are what a release's reading accepts, as its build measured them (tools/vllm_variants.py `read_alike`:
vLLM 0.28 reads an FP8 KV cache from {"dynamic": false, "num_bits": 8.0, "type": "float", ...}, "fp8" and
quant_method "modelopt_fp4").
F with a dot is a path from config.json's top; else a field of its text part. A condition's `with` lists conditions that
must hold too (vLLM 0.28 reads a declared KV cache of a ModelOpt quant_method only). Hostile values hold nothing.
"""

from __future__ import annotations

from repair.arch.layer_rules import text_part

ABSENT = object()


def lookup(config: dict | None, field: str):
    """config.json's value at `field` (see the module docstring), ABSENT where it holds none."""
    top, _, leaf = field.partition(".")
    if not leaf:
        return text_part(config).get(field, ABSENT)
    parent = config.get(top) if isinstance(config, dict) else None
    return parent.get(leaf, ABSENT) if isinstance(parent, dict) else ABSENT


def same(a, b) -> bool:
    """JSON equality with types kept (True is not 1, 1.0 is not 1), recursively."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


def alike(value, want) -> bool:
    """`value` as a release reading `want`'s keys compares it (`includes`): a number by value (8.0 is 8; a bool is no
    number), an object holding at least `want`'s keys, each alike; anything else JSON-equal, types kept."""
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == want
    if isinstance(want, dict):
        return isinstance(value, dict) and all(k in value and alike(value[k], w) for k, w in want.items())
    return same(value, want)


def holds(condition, config: dict | None) -> bool:
    """Whether config.json meets a recorded condition (a malformed condition meets nothing)."""
    field = condition.get("field") if isinstance(condition, dict) else None
    if not isinstance(field, str):
        return False
    value = lookup(config, field)
    also = condition.get("with", [])
    if value is ABSENT or not isinstance(also, list) or not all(isinstance(c, dict) and "with" not in c and holds(c, config)
                                                                for c in also):
        return False
    if "is" in condition:
        return same(value, condition["is"])
    if "includes" in condition:
        return alike(value, condition["includes"])
    if "any_case" in condition or "starts_with" in condition:
        want = condition.get("any_case", condition.get("starts_with"))
        if not isinstance(value, str) or not isinstance(want, str):
            return False
        return value.lower() == want.lower() if "any_case" in condition else value.startswith(want)
    if "other_than" in condition:
        other = condition["other_than"]
        return type(value) is type(other) and not same(value, other)
    return False


def varied(entry: dict | None, config: dict | None) -> dict | None:
    """The entry as the release builds it for `config`: the first recorded variant whose condition holds overlays its
    modules and fused layers (and its MTP drafter's build, and what its load_weights raises on, where it records them:
    MiniCPMMoE's NVFP4 expert scales), and its field no longer disagrees (`config.agrees_with`); else the entry."""
    found = next((v for v in (entry or {}).get("variants") or () if holds(v, config)), None)
    if found is None:
        return entry
    own = entry.get("config") or {}
    agreed = {k: v for k, v in (own.get("agrees_with") or {}).items() if k != found["field"]}
    said = f"; built again with {found['field']} as config.json sets it (the profile's variants)"
    drafter = {"mtp": found["mtp"]} if "mtp" in found else {}
    refused = {"weight_refused": found["weight_refused"]} if isinstance(found.get("weight_refused"), dict) else {}
    return {**entry, "modules": found["modules"], "fused": found["fused"], **drafter, **refused,
            "config": {**{k: v for k, v in own.items() if k != "agrees_with"}, "source": f"{own.get('source', '')}{said}",
                       **({"agrees_with": agreed} if agreed else {})}}
