"""ModelOpt MIXED_PRECISION: each layer's algorithm comes from a `quantized_layers` map.

ModelOpt writes `quant_algo: MIXED_PRECISION` when a model mixes algorithms. hf_quant_config.json
`quantization.quantized_layers` and config.json `quantization_config.quantized_layers` map layer
names to `{"quant_algo": "NVFP4", "group_size": 16}`, `{"quant_algo": "FP8"}`, ...; config.json also
groups the layers into `config_groups` by algorithm (targets = layer names). vLLM 0.32 reads
config.json's map (`ModelOptMixedPrecisionConfig`), builds a layer it does not find unquantized, and
still applies `exclude_modules` / `ignore` first. Tensors group exactly as ModelOpt NVFP4's do (the
leaves are the same; an FP8 layer's float8 weight is recognised by its tensors, see nvfp4_packed).
"""

from __future__ import annotations

import copy

from repair.errors import BadInput, UsageError
from repair.formats import modelopt_nvfp4, nvfp4_packed
from repair.formats.algorithms import GROUP, MIXED, LayerAlgorithms, kv_cache_declared, layer_map, single_algo
from repair.formats.base import Covers, Declaration, routed_layer
from repair.formats.modules import split_name
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, Checkpoint

NAME = "modelopt-mixed"
# ModelOpt's convert_hf_config._quant_algo_to_group_config("NVFP4", 16): the config group of a layer put back as NVFP4
NVFP4_ENTRY = {"quant_algo": "NVFP4", "group_size": GROUP}
NVFP4_GROUP = {"input_activations": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP},
               "weights": {"dynamic": False, "num_bits": 4, "type": "float", "group_size": GROUP}}


def _says_mixed(section: object) -> bool:
    if isinstance(section, dict) and isinstance(section.get("quantization"), dict):
        section = section["quantization"]  # ModelOpt's raw {"producer", "quantization"} block in config.json
    return isinstance(section, dict) and isinstance(section.get("quant_algo"), str) and section["quant_algo"].upper() == MIXED


def _sections(ckpt: Checkpoint) -> tuple[dict | None, dict | None]:
    """(config.json quantization_config, hf_quant_config.json quantization), each checked to be an object."""
    quant_cfg = (ckpt.config or {}).get("quantization_config")
    if quant_cfg is not None and not isinstance(quant_cfg, dict):
        raise BadInput(f"{ckpt.root / CONFIG}: quantization_config is not an object; fix the config")
    section = None
    if ckpt.hf_quant_config is not None:
        section = ckpt.hf_quant_config.get("quantization")
        if not isinstance(section, dict):
            raise BadInput(f"{ckpt.root / HF_QUANT_CONFIG}: missing the 'quantization' object; fix or re-download it")
    return quant_cfg, section


def read_declaration(ckpt: Checkpoint) -> Declaration:
    """Both files' claims; the layer map vLLM uses is config.json's when it has a quantization_config."""
    cfg_path, hf_path = ckpt.root / CONFIG, ckpt.root / HF_QUANT_CONFIG
    quant_cfg, section = _sections(ckpt)
    for path, part in ((cfg_path, quant_cfg), (hf_path, section)):
        if part is not None and part.get("quant_algo") is not None and single_algo(part["quant_algo"], path) != MIXED:
            raise BadInput(f"{cfg_path} and {hf_path} declare different quant_algo ({part['quant_algo']} in {path.name}, "
                           f"{MIXED} in the other); re-download the checkpoint, or make both {MIXED}")
    if quant_cfg is not None and quant_cfg.get("quant_method") not in (None, "modelopt"):
        raise BadInput(f"{cfg_path}: quant_method {quant_cfg.get('quant_method')!r} with quant_algo {MIXED} is not supported; "
                       "this tool reads ModelOpt's (quant_method \"modelopt\")")
    cfg_layers = layer_map(quant_cfg.get("quantized_layers"), cfg_path, "quantization_config.quantized_layers") if quant_cfg else None
    hf_layers = layer_map(section.get("quantized_layers"), hf_path, "quantization.quantized_layers") if section else None
    # vLLM 0.32 get_quant_config: a config.json map-less MIXED_PRECISION (older exports) falls through to hf_quant_config.json
    reads_hf = quant_cfg is None or ("quantized_layers" not in quant_cfg and section is not None)
    used, where = (hf_layers, hf_path) if reads_hf else (cfg_layers, cfg_path)
    if not used:
        raise BadInput(f"{where}: quant_algo {MIXED} without a non-empty quantized_layers map, which vLLM refuses; "
                       "re-download the checkpoint, or copy quantized_layers from the other config file")
    if quant_cfg is not None:
        _config_groups(quant_cfg, cfg_path)
    ignore = nvfp4_packed.name_list(quant_cfg.get("ignore", []), cfg_path, "quantization_config.ignore") if not reads_hf else None
    exclude = nvfp4_packed.name_list(section.get("exclude_modules", []), hf_path, "quantization.exclude_modules") if section is not None else None
    return Declaration(MIXED, ignore, exclude, MODELOPT_MIXED, None, LayerAlgorithms(used),
                       LayerAlgorithms(hf_layers) if hf_layers is not None else None,
                       kv_cache_declared(None if reads_hf else quant_cfg, section))


def _config_groups(quant_cfg: dict, path: object) -> dict:
    groups = quant_cfg.get("config_groups") or {}
    if not isinstance(groups, dict) or not all(isinstance(g, dict) for g in groups.values()):
        raise BadInput(f"{path}: quantization_config.config_groups must be an object of objects; fix the config")
    for name, group in groups.items():
        nvfp4_packed.name_list(group.get("targets", []), path, f"quantization_config.config_groups.{name}.targets")
    return groups


def emptied_parents(keys, quantized: set[str], names: set[str]) -> list[str]:
    """Keys naming no stored module (a routed-experts layer `...mlp.experts`) every quantized module under which
    is made unquantized: left in the map, TensorRT-LLM (which reads hf_quant_config.json's) would still see them."""
    parents = {k: set() for k in keys if k not in quantized}
    for module in quantized:  # each module's dotted prefixes: linear in the model's size
        for i, char in enumerate(module):
            if char == "." and module[:i] in parents:
                parents[module[:i]].add(module)
    return [k for k, under in parents.items() if under and under <= names]


def _taken(key: str, named: set[str], longest: int) -> bool:
    """`key` is one of `named` or under one: a set lookup per dot within the longest name (not a test per name)."""
    return isinstance(key, str) and (key in named or any(c == "." and key[:i] in named for i, c in enumerate(key[:longest + 1])))


def with_exclusions(ckpt: Checkpoint, names: list[str], covers: Covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]:
    """New (config.json, hf_quant_config.json) contents where `names` are unquantized and `remove` NVFP4 again.

    A layer is made unquantized by taking it (and any key under it) out of `quantized_layers` in both
    files, with a parent key left covering only unquantized modules (`emptied_parents`), and out of
    config.json's config-group targets (a group left without targets is dropped);
    one still resolved through a parent key (routed experts), or beside a layer the lists already exclude (vLLM's
    is_layer_skipped wants every shard of a fused layer excluded alike), is also added to the exclusion lists.
    A layer in `remove` is put back as `{"quant_algo": "NVFP4", "group_size": 16}` in ModelOpt's NVFP4
    group. Where the two files' maps disagreed on input, config.json's (which vLLM reads) decides.
    """
    config, hf_quant = copy.deepcopy(ckpt.config), copy.deepcopy(ckpt.hf_quant_config)
    cfg = config.get("quantization_config") if config is not None else None
    section = hf_quant.get("quantization") if hf_quant is not None else None
    maps = [part["quantized_layers"] for part in (cfg, section) if isinstance(part, dict) and isinstance(part.get("quantized_layers"), dict)]
    quantized = {split_name(t)[0] for t in ckpt.infos() if split_name(t)[1] == "weight_scale"}
    named, longest = set(names), max(map(len, names), default=0)
    for layers in maps:
        for key in [k for k in layers if _taken(k, named, longest)] + emptied_parents(layers, quantized, named):
            del layers[key]
        layers.update({n: dict(NVFP4_ENTRY) for n in remove})
    if maps and not maps[0]:
        raise UsageError(f"{ckpt.root}: the recipe turns every layer quantized_layers declares BF16, leaving {MIXED} with an empty "
                         "quantized_layers map, which vLLM refuses; use --target bf16 (drops the quantization config and the "
                         "KV-cache scales), or keep at least one layer quantized")
    if isinstance(cfg, dict):
        _regroup(cfg, names, remove)
    if len(maps) == 2 and maps[0] != maps[1]:  # they disagreed on input: config.json, which vLLM reads, decides
        section["quantized_layers"] = copy.deepcopy(maps[0])
    resolved = LayerAlgorithms(tuple((k, str(v.get("quant_algo", "")).upper()) for k, v in maps[0].items())) if maps else None
    lists = modelopt_nvfp4.exclusion_lists(config, hf_quant)
    beside = {n.rpartition(".")[0] for n in names if any(covers(x, n) for x in lists)}  # shards of a fused layer excluded alike
    still = [n for n in names if (resolved is not None and resolved.resolve(routed_layer(n)) is not None) or n.rpartition(".")[0] in beside]
    return modelopt_nvfp4.lists_with(config, hf_quant, still, covers, remove)


def _regroup(cfg: dict, names: list[str], remove: list[str]) -> None:
    """config_groups targets without `names` (emptied groups dropped), with `remove` in the NVFP4 group."""
    groups = cfg.get("config_groups")
    if not isinstance(groups, dict):
        return
    named, longest = set(names), max(map(len, names), default=0)
    for key in list(groups):
        targets = groups[key].get("targets") or []
        kept = [t for t in targets if not _taken(t, named, longest)]
        if kept:
            groups[key]["targets"] = kept
        else:
            del groups[key]
    if not remove:
        return
    nvfp4 = next((g for g in groups.values() if {k: v for k, v in g.items() if k != "targets"} == NVFP4_GROUP), None)
    if nvfp4 is None:
        index = next(i for i in range(len(groups) + 1) if f"group_{i}" not in groups)
        nvfp4 = groups[f"group_{index}"] = {**copy.deepcopy(NVFP4_GROUP), "targets": []}
    nvfp4["targets"] = sorted(set(nvfp4["targets"]) | set(remove))


class ModelOptMixed(modelopt_nvfp4.ModelOptNvfp4):
    """ModelOpt MIXED_PRECISION: NVFP4's tensors and exclusion rule, plus a per-layer algorithm map."""

    NAME = NAME

    def claims(self, ckpt: Checkpoint) -> bool:
        """Either config file says quant_algo MIXED_PRECISION."""
        hf = ckpt.hf_quant_config
        return _says_mixed((ckpt.config or {}).get("quantization_config")) or (isinstance(hf, dict) and _says_mixed(hf.get("quantization")))

    read_declaration = staticmethod(read_declaration)
    with_exclusions = staticmethod(with_exclusions)


MODELOPT_MIXED = ModelOptMixed()
