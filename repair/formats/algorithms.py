"""ModelOpt quantization algorithms: which ones the tool reads, and each layer's declared one under MIXED_PRECISION.

ModelOpt writes one `quant_algo` when every quantized layer uses the same algorithm, else
`MIXED_PRECISION` with a `quantized_layers` map (layer -> {"quant_algo": ..., "group_size": ...}).
vLLM 0.32 resolves a runtime layer's algorithm from that map in a fixed order (`LayerAlgorithms.lookup`);
a layer it does not find is built unquantized. Anything else (MXFP4, block-wise FP8, ...) is refused
in one line that names the algorithm and what is supported.
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass, field

from repair.errors import BadInput

SINGLE_ALGOS = ("NVFP4", "W4A16_NVFP4", "NVFP4_AWQ", "FP8")  # readable as a checkpoint's single quant_algo, or per layer
MIXED = "MIXED_PRECISION"
NVFP4_FAMILY = frozenset({"NVFP4", "W4A16_NVFP4", "NVFP4_AWQ"})  # packed fp4 weights with 16-element fp8 block scales
SUPPORTED = ("this tool reads ModelOpt NVFP4, W4A16_NVFP4, NVFP4_AWQ, FP8 (per-tensor) and MIXED_PRECISION "
             "checkpoints whose layers use those")
GROUP = 16
# vLLM 0.32 modelopt.py ModelOptMixedPrecisionConfig._resolve_quant_algo, step 4: fused projections
FUSED_FALLBACK = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
_BAD_NAME = re.compile(r"[\x00-\x20\x7f]")


def refusal(where: object, what: str, algo: object) -> BadInput:
    """The one-line refusal for an algorithm the tool does not read."""
    return BadInput(f"{where}: {what} {algo!r} is not supported; {SUPPORTED}")


def single_algo(value: object, where: object) -> str:
    """A checkpoint-wide quant_algo, upper-cased as vLLM reads it, or the refusal."""
    algo = value.upper() if isinstance(value, str) else value
    if algo not in SINGLE_ALGOS and algo != MIXED:
        raise refusal(where, "quant_algo", value)
    return algo


def kv_cache_declared(quant_cfg: dict | None, hf_section: dict | None) -> str | None:
    """The KV-cache quantization the config vLLM reads declares, upper-cased; None when it declares none.

    vLLM 0.32 (ModelOptQuantConfigBase.from_config) reads config.json's `quantization_config` when there is
    one, and then only its `kv_cache_scheme` object (a string, or hf_quant_config.json's `kv_cache_quant_algo`,
    is not read); without one, hf_quant_config.json's `kv_cache_quant_algo`. config.json's quantization_config in
    ModelOpt's raw `{"producer", "quantization": {...}}` form is read like hf_quant_config.json (its `quantization`)."""
    if quant_cfg is not None and isinstance(quant_cfg.get("quantization"), dict):
        quant_cfg, hf_section = None, quant_cfg["quantization"]
    if quant_cfg is not None:
        scheme = quant_cfg.get("kv_cache_scheme")
        if not isinstance(scheme, dict):
            return None
        return "FP8" if scheme.get("type") == "float" and scheme.get("num_bits") == 8 else str(scheme.get("type") or "?").upper()
    algo = (hf_section or {}).get("kv_cache_quant_algo")
    return algo.upper() if isinstance(algo, str) and algo else None


def layer_map(value: object, where: object, key: str) -> tuple[tuple[str, str], ...] | None:
    """A `quantized_layers` map validated as hostile input: (layer name, upper-cased algorithm) in file order."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise BadInput(f"{where}: {key} must be an object of layer name -> {{\"quant_algo\": ...}}; fix the config")
    out = []
    for name, info in value.items():
        if not name or len(name) > 1000 or _BAD_NAME.search(name):
            raise BadInput(f"{where}: {key} has a layer name {name[:80]!r} that is empty, too long or holds spaces or control "
                           "characters; fix the config")
        algo = info.get("quant_algo") if isinstance(info, dict) else None
        if not isinstance(algo, str):
            raise BadInput(f"{where}: {key}[{name!r}] has no quant_algo string; fix the config")
        if algo.upper() not in SINGLE_ALGOS:
            raise refusal(where, f"{key}[{name!r}] quant_algo", algo)
        size = info.get("group_size", GROUP)
        if algo.upper() in NVFP4_FAMILY and size != GROUP:
            raise BadInput(f"{where}: {key}[{name!r}] group_size {size!r} is not NVFP4's {GROUP}; fix the config")
        out.append((name, algo.upper()))
    return tuple(out)


@dataclass(frozen=True)
class LayerAlgorithms:
    """A `quantized_layers` map, indexed for vLLM 0.32's per-layer lookup (45k layers resolve in linear time).

    vLLM's parent-prefix step takes the first key (in file order) under `prefix.`. The keys are kept sorted, so the
    keys under a prefix are one range (bisect), and a sparse table gives the range's first file position: memory
    O(n log n) references, never every dotted prefix of every key (quadratic in the length of a name)."""

    entries: tuple[tuple[str, str], ...]  # (layer name as stored in the config, algorithm), in file order
    _direct: dict[str, str] = field(init=False, compare=False, hash=False, repr=False)
    _sorted: list[str] = field(init=False, compare=False, hash=False, repr=False)
    _first: list[list[int]] = field(init=False, compare=False, hash=False, repr=False)  # level k: min file index of 2^k sorted keys

    def __post_init__(self) -> None:
        order = sorted(range(len(self.entries)), key=lambda i: self.entries[i][0])
        levels, width = [order], 1
        while 2 * width <= len(order):
            below = levels[-1]
            levels.append([min(below[i], below[i + width]) for i in range(len(order) - 2 * width + 1)])
            width *= 2
        object.__setattr__(self, "_direct", dict(self.entries))
        object.__setattr__(self, "_sorted", [self.entries[i][0] for i in order])
        object.__setattr__(self, "_first", levels)

    def _under(self, prefix: str) -> str | None:
        """The algorithm of the first key in file order that starts with `prefix.` (None: no such key)."""
        low = bisect_left(self._sorted, prefix + ".")
        high = bisect_left(self._sorted, prefix + "/", low)  # "/" follows "." in code order
        if low == high:
            return None
        level = (high - low).bit_length() - 1
        table = self._first[level]
        return self.entries[min(table[low], table[high - (1 << level)])][1]

    def first_under(self, prefix: str) -> str | None:
        """The algorithm of the first key in file order under `prefix.` (runtimes' parent-prefix step)."""
        return self._under(prefix)

    def as_dict(self) -> dict[str, str]:
        return dict(self._direct)

    def entry(self, name: str) -> str | None:
        """The algorithm the map lists under exactly `name` (None: no such key)."""
        return self._direct.get(name)

    def lookup(self, prefix: str, packed: dict[str, tuple[str, ...]] | None = None) -> tuple[str | None, str | None]:
        """(algorithm, vLLM's error) for the runtime layer `prefix`, in vLLM 0.32's order.

        vllm/model_executor/layers/quantization/modelopt.py, ModelOptMixedPrecisionConfig._resolve_quant_algo:
        1. direct lookup of each name candidate (`_quantized_layer_prefix_candidates`: the prefix, `lm_head`
           for `*.lm_head`, the `language_model.model.` / `model.language_model.` swap);
        2. a packed layer (`packed_modules_mapping`, e.g. qkv_proj) takes its shards' algorithm, which must agree;
        3. parent prefix: the first key under `candidate.` (routed experts `...mlp.experts`), then for a name
           ending `.experts` the first key under its parent;
        4. fused fallback: qkv_proj / gate_up_proj take their shards' algorithm.
        Not found: (None, None), built unquantized. Shards that disagree: (None, the ValueError vLLM raises).
        """
        candidates = _candidates(prefix)
        for candidate in candidates:
            if candidate in self._direct:
                return self._direct[candidate], None
        proj = prefix.rsplit(".", 1)[-1]
        if packed and proj in packed:
            found = self._shards(_candidates(prefix.rsplit(".", 1)[0]), packed[proj])
            if found:
                return _agreed(prefix, found)
        for candidate in candidates:
            found = self._under(candidate)
            if found is not None:
                return found, None
        if prefix.endswith(".experts"):
            found = self._under(prefix.rsplit(".experts", 1)[0])
            if found is not None:
                return found, None
        shards = FUSED_FALLBACK.get(proj)
        if shards is not None:
            for candidate in candidates:
                found = self._shards((candidate.rsplit(".", 1)[0],), shards)
                if found:
                    return _agreed(prefix, found)
        return None, None

    def resolve(self, prefix: str, packed: dict[str, tuple[str, ...]] | None = None) -> str | None:
        """The algorithm vLLM resolves for `prefix` (None: not found, or shards that disagree; see `lookup`)."""
        return self.lookup(prefix, packed)[0]

    def _shards(self, bases: tuple[str, ...], shards: tuple[str, ...]) -> set[str]:
        return {self._direct[f"{b}.{s}"] for b in bases for s in shards if f"{b}.{s}" in self._direct}


def _agreed(prefix: str, found: set[str]) -> tuple[str | None, str | None]:
    if len(found) == 1:
        return next(iter(found)), None
    return None, (f"ValueError: Mixed quant_algo within fused layer {prefix}: {{{', '.join(map(repr, sorted(found)))}}}. "
                  "All shards must use the same quantization.")


def _candidates(prefix: str) -> tuple[str, ...]:
    """vLLM's `_quantized_layer_prefix_candidates` (modelopt.py, 0.32)."""
    out = [prefix]
    if prefix.endswith(".lm_head"):
        out.append("lm_head")
    if prefix.startswith("language_model.model."):
        out.append("model.language_model." + prefix[len("language_model.model."):])
    elif prefix.startswith("model.language_model."):
        out.append("language_model.model." + prefix[len("model.language_model."):])
    return tuple(dict.fromkeys(out))
