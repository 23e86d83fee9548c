"""A row's facts that depend on one config field, learned by building vLLM's model again with the field varied (run in
.venv-vllm; tools/vllm_profile.py records the answers). Imports nothing from ``repair``.

The profile builds each class once, from one small config, so a class that builds other layers for another value of a
field gets a row of one branch: vLLM 0.32's DeepSeek-V2 builds fused_qkv_a_proj (and adds it to its packed mapping)
only where q_lora_rank is set (deepseek_v2.py:1051-1065, 1903-1909), a ReplicatedLinear kv_a_proj_with_mqa of its own
where it is null (DeepSeek-V2-Lite's published config); MiniCPM builds MiniCPMMoE (router GateLinear, no quant config;
experts stacked in its own ws / w2s parameters) where num_experts is not 0 (minicpm.py:353-369). `VARIANTS` names the
field and how it is varied; `variants` builds the model with it and records the modules and fused layers that build
has, with the condition, where they differ from the profiled build's:
  {"field": F, "is": V}          config.json sets F to V (null included; an absent F is the config class's default);
  {"field": F, "other_than": V}  config.json sets F to a value of V's type other than V (the profiled build's value);
                                 measured with two such values, both of which must build the same layers.
A field with a dot is a path from config.json's top (`quantization_config.kv_cache_scheme`), else the text part's.

`refusal_lifted`: the same condition form for a build refusal (the profile's `build_refused`): vLLM 0.28 resolves
--kv-cache-dtype auto from a ModelOpt config.json's kv_cache_scheme (engine/arg_utils.py:1986), and its DeepSeek-V4
attention asserts an fp8 KV cache (attention.py:106): the model is built again with each of `QUANT_VARIANTS`, and the
refusal is recorded `unless` any of those under which the build no longer raises the same error at the same line (`then`:
what the build does instead, in its words: on this host 0.28 stops at a CUDA-only kernel, a host limit), `with` the
quant method it was built with (each a condition that must hold too). Each condition is then built again with values the
release may read alike (`respellings`): where every one lifts the refusal too, it is recorded as wide as that reading
(`includes`: 0.28's get_kv_cache_quant_algo_string, torch_utils.py:445-450, tests `dynamic is False`, `num_bits == 8`,
`type == "float"` and reads no other key; `any_case`: it lowers a kv_cache_quant_algo, 465; `starts_with`: it reads a
quant_method starting with "modelopt", 436-437).
"""

from __future__ import annotations

from typing import Callable

FP8_KV = {"dynamic": False, "num_bits": 8, "type": "float"}  # ModelOpt's config.json kv_cache_scheme for an FP8 KV cache
# architecture -> ({"field", "is" | "other_than", "probes"}, ...): each probe is the fields written for one build
VARIANTS: dict[str, tuple[dict, ...]] = {
    "DeepseekV2ForCausalLM": ({"field": "q_lora_rank", "is": None, "probes": [{"q_lora_rank": None}]},),
    # V2's class body (deepseek_v2.py:2005-2006): Moonlight-16B-A3B and Kimi-VL-A3B's text part set q_lora_rank null
    "DeepseekV3ForCausalLM": ({"field": "q_lora_rank", "is": None, "probes": [{"q_lora_rank": None}]},),
    "MiniCPMForCausalLM": ({"field": "num_experts", "other_than": 0,
                            "probes": [{"num_experts": 2, "num_experts_per_tok": 1},
                                       {"num_experts": 4, "num_experts_per_tok": 2}]},),
}
# the KV-cache declarations vLLM 0.28's resolve_kv_cache_dtype_string reads from config.json's ModelOpt block
# (utils/torch_utils.py:427-470: kv_cache_scheme's dict, or kv_cache_quant_algo's name), each asked of the build
# the quant method the declaration was built with, recorded beside it (`with`): vLLM 0.28 reads a KV-cache declaration
# only where quant_method starts with "modelopt" (torch_utils.py:436-437), so a compressed-tensors config's is not it
QUANT_METHOD = {"field": "quantization_config.quant_method", "is": "modelopt"}
QUANT_VARIANTS = ({"field": "quantization_config.kv_cache_scheme", "is": FP8_KV},
                  {"field": "quantization_config.kv_cache_quant_algo", "is": "FP8"})
# facts the profile learns by loading transformers' checkpoint into the profiled build: a variant records none of
# them, so none is recorded for a row holding one (they could differ in the other build). The MTP drafter's build
# (`mtp`: its architecture, modules, renames) a variant records again (`built` builds it too: DeepSeekMTP's layer
# reads q_lora_rank as the main model's does); a drafter's load facts it does not.
LOAD_FACTS = ("prefixes", "loads_into", "nvfp4_load_refused", "dropped", "dropped_in_layers", "without",
              "load_refused", "modelopt_fp4_only", "nvfp4_refused")
DRAFTER_BUILT = {"architecture", "modules", "renames", "unbuilt"}


def condition(rule: dict) -> dict:
    return {k: v for k, v in rule.items() if k != "probes"}


def varied(config: dict, probe: dict) -> dict:
    """`config` with the probe's fields written (a dotted field under its top-level dict; else the text part's)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    out = dict(config, text_config=dict(text)) if text is not None else dict(config)
    for field, value in probe.items():
        top, _, leaf = field.partition(".")
        if leaf:
            out[top] = dict(out.get(top) or {}, **{leaf: value})
        else:
            (out["text_config"] if text is not None else out)[field] = value
    return out


def variants(arch: str, config: dict, row: dict, built: Callable[[dict], dict], log) -> list[dict]:
    """[{**condition, "modules", "fused"[, "mtp"]}]: the facts vLLM's build of `config` varied per VARIANTS[arch] has
    where they differ from the profiled `row`'s (`built(config)`: {"modules", "fused"} of that build, and "mtp", its
    drafter's build, where the config has MTP layers)."""
    held = [k for k in LOAD_FACTS if row.get(k)] + [f"mtp.{k}" for k in sorted(set(row.get("mtp") or {}) - DRAFTER_BUILT)]
    out = []
    for rule in VARIANTS.get(arch, ()):
        if held:
            log(f"{arch}: no variant for {rule['field']} (the row holds load facts a variant does not learn: {held})")
            continue
        if "other_than" in rule and config.get(rule["field"], rule["other_than"]) != rule["other_than"]:
            raise ValueError(f"{arch}: VARIANTS' {rule['field']} other_than is not the profiled build's value")
        facts = [built(varied(config, probe)) for probe in rule["probes"]]
        if any(f != facts[0] for f in facts[1:]):
            log(f"{arch}: no variant for {rule['field']} (its probes build different layers)")
            continue
        if {k: row.get(k) for k in facts[0]} != facts[0]:
            out.append({**condition(rule), **facts[0]})
    return out


def refusal_lifted(config: dict, error: BaseException, site: str, attempt: Callable[[dict], BaseException | None],
                   refusal_site: Callable[[BaseException], str | None]) -> list[dict]:
    """The QUANT_VARIANTS conditions under which vLLM's build of `config` no longer raises `error` at `site`
    (`attempt(config)`: the exception the build raises, None when it builds), each with what the build did then; each
    condition as wide as the release's reading, `read_alike`."""
    said, out = f"{type(error).__name__}: {error}", []
    method = (config.get("quantization_config") or {}).get("quant_method", QUANT_METHOD["is"])

    def lifted(probe: dict) -> BaseException | None | bool:
        other = attempt(varied(config, probe))
        return other if other is None or (f"{type(other).__name__}: {other}", refusal_site(other)) != (said, site) else False
    for rule in QUANT_VARIANTS:
        other = lifted({rule["field"]: rule["is"]})
        if other is False:
            continue
        built = {**read_alike(rule, lambda v, f=rule["field"]: lifted({f: v}) is not False),
                 "with": [read_alike({**QUANT_METHOD, "is": method}, lambda v: lifted({rule["field"]: rule["is"],
                                                                                    QUANT_METHOD["field"]: v}) is not False)]}
        if other is None:
            out.append({**built, "then": "it builds"})
        else:
            where = refusal_site(other) or "outside vLLM's code: this host"
            out.append({**built, "then": f"the build stops later, at {where}: {type(other).__name__}: {str(other)[:120]}"})
    return out


def respellings(value) -> tuple[str, list] | None:
    """(the wider condition, the values it adds, each asked of the build) for a value a reader may read alike:
    `includes` for an object (a number as a float, one more key), `starts_with` for a quant_method (ModelOpt's other
    method names), `any_case` for any other string; None for anything else."""
    if isinstance(value, dict):
        floats = {k: float(v) for k, v in value.items() if isinstance(v, int) and not isinstance(v, bool)}
        return "includes", [{**value, **floats}, {**value, "probe_extra_key": 1}]
    if isinstance(value, str) and value == QUANT_METHOD["is"]:
        return "starts_with", [value + "_fp4", value + "_mixed"]
    if isinstance(value, str):
        return "any_case", sorted({value.lower(), value.upper(), value.title()} - {value})
    return None


def read_alike(rule: dict, lifts: Callable[[object], bool]) -> dict:
    """`rule` ({"field", "is"}) widened to {"field", kind: value} where the release's build reads every value
    `respellings` adds as it reads the recorded one (`lifts`: the refusal is lifted with it); else as it is."""
    wider = respellings(rule["is"])
    if wider is None or not all(lifts(v) for v in wider[1]):
        return rule
    return {"field": rule["field"], wider[0]: rule["is"]}
