"""Which names vLLM tests an exclusion list against for a layer it builds fused from checkpoint shards (qkv_proj from
q/k/v_proj), in which order, and its error when the shards disagree, per release and config kind (run in the release's
venv; tools/vllm_profile.py records it as the profile's `fused_exclusions`).

vLLM's own exclusion tests are run on a fused prefix with the packed mapping vLLM gives them: ModelOpt's
`ModelOptNvFp4Config.is_layer_excluded` (modelopt.py:187-222 in 0.32, 138-174 in 0.28: is_layer_skipped's exact test
of the fused name then of every shard, quant_utils.py:617-690, then substring and fnmatch tests of the fused prefix)
and compressed-tensors' `should_ignore_layer` (compressed_tensors/utils.py:53-70 in 0.32 with config_utils.py
find_matching_patterns; utils.py in 0.28 tests the fused name only for equality). Each probe list names the fused
layer or its shards by an exact name or by a pattern only (ModelOpt: a substring and an fnmatch glob, which must agree;
compressed-tensors: `re:`), and the answers give `steps`: the ordered tests, "fused:exact", "fused:pattern",
"shards:exact", "shards:pattern" (a step's tests run together), and `mixed`, the message of the ValueError shards that
disagree raise, the fused prefix as {prefix} and the shard list as {shards}. A release whose answers no order explains stops loudly.
Imports nothing from ``repair``.
"""

from __future__ import annotations

PARENT = "model.layers.0.self_attn"
FUSED = f"{PARENT}.qkv_proj"
SHARDS = ["q_proj", "k_proj", "v_proj"]
MAPPING = {"qkv_proj": SHARDS, "gate_up_proj": ["gate_proj", "up_proj"]}
# kind -> test -> {side: the entries naming that side by that test alone}
PROBES = {
    "modelopt": {"exact": {"fused": [[FUSED]], "shards": [[f"{PARENT}.{s}" for s in SHARDS]]},
                 "pattern": {"fused": [["layers.0.self_attn.qkv"], ["*.self_attn.qkv?proj"]],  # substring, fnmatch
                             "shards": [[f"layers.0.self_attn.{s}" for s in SHARDS], [f"*.self_attn.{s}" for s in SHARDS]]}},
    "compressed-tensors": {"exact": {"fused": [[FUSED]], "shards": [[f"{PARENT}.{s}" for s in SHARDS]]},
                           "pattern": {"fused": [[r"re:.*self_attn\.qkv_proj$"]],
                                       "shards": [[rf"re:.*self_attn\.{s}$" for s in SHARDS]]}},
}


def modelopt_asks(entries: list[str]) -> bool:
    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4Config

    config = ModelOptNvFp4Config.from_config({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                                              "ignore": list(entries)})
    config.packed_modules_mapping = MAPPING
    return bool(config.is_layer_excluded(FUSED))


def ct_asks(entries: list[str]) -> bool:
    from vllm.model_executor.layers.quantization.compressed_tensors.utils import should_ignore_layer

    return bool(should_ignore_layer(FUSED, ignore=list(entries), fused_mapping=MAPPING))


ASK = {"modelopt": modelopt_asks, "compressed-tensors": ct_asks}


def answer(kind: str, entries: list[str]) -> bool | str:
    try:
        return ASK[kind](entries)
    except ValueError as exc:
        return str(exc)  # the message (ValueError's, each release's), as its model build stops with it


def one(kind: str, test: str, side: str) -> bool:
    """Whether vLLM excludes the fused layer for lists naming `side` by `test` alone (every probe list must agree)."""
    found = {answer(kind, entries) for entries in PROBES[kind][test][side]}
    if len(found) != 1 or not isinstance(next(iter(found)), bool):
        raise SystemExit(f"vLLM's {kind} exclusion answers {sorted(map(str, found))} for {test} entries naming the {side}")
    return found.pop()


def fused_exclusions(kind: str) -> dict:
    """{"steps": [...], "mixed": "<vLLM's error, {prefix} and {shards}>"} for one config kind."""
    tests = {(side, test): one(kind, test, side) for test in ("exact", "pattern") for side in ("fused", "shards")}
    mixed = answer(kind, [f"{PARENT}.{SHARDS[0]}"])
    if not isinstance(mixed, str) or FUSED not in mixed:
        raise SystemExit(f"vLLM's {kind} exclusion answers {mixed!r} for one shard listed alone: no refusal to record")
    mixed = mixed.replace(str(SHARDS), "{shards}").replace(FUSED, "{prefix}")
    # a fused-name test before the shard step excludes the layer though one shard alone is listed beside it
    first = {test for test in ("exact", "pattern") if tests[("fused", test)]
             and answer(kind, PROBES[kind][test]["fused"][0] + [f"{PARENT}.{SHARDS[0]}"]) is True}
    later = {test for test in ("exact", "pattern") if tests[("fused", test)]} - first
    shards = [test for test in ("exact", "pattern") if tests[("shards", test)]]
    steps = [f"fused:{t}" for t in ("exact", "pattern") if t in first]
    steps += ["shards:" + "+".join(shards)] if shards else []
    steps += [f"fused:{t}" for t in ("exact", "pattern") if t in later]
    return {"steps": steps, "mixed": mixed}


def all_fused_exclusions() -> dict:
    return {kind: fused_exclusions(kind) for kind in ASK}


if __name__ == "__main__":
    import json

    print(json.dumps(all_fused_exclusions(), indent=1))
