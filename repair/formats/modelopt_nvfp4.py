"""ModelOpt's NVFP4 checkpoint format: how its tensors group into modules and how its two
config files declare exclusions.

Tensors per quantized Linear: `weight` uint8 [out, in/2], `weight_scale` float8_e4m3fn
[out, in/16], `weight_scale_2` float32 scalar, optional `input_scale`. Declarations live in
config.json `quantization_config.ignore` (read first by vLLM) and hf_quant_config.json
`quantization.exclude_modules` (read first by TensorRT-LLM); we always keep them in agreement.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from repair.errors import BadInput
from repair.io.checkpoint import CONFIG, HF_QUANT_CONFIG, Checkpoint
from repair.io.safetensors import TensorInfo
from repair.modules import StoredModule, split_name
from repair.nvfp4_health import block_scale_stats, global_scale_problem, read_f32_scalar

NAME = "modelopt-nvfp4"
SIDECARS = ("weight_scale", "weight_scale_2", "input_scale")
BLOCK = 16


@dataclass(frozen=True)
class Declaration:
    """What the config files claim about quantization (None where a file or key is absent)."""

    quant_algo: str | None
    ignore: tuple[str, ...] | None  # config.json quantization_config.ignore
    exclude_modules: tuple[str, ...] | None  # hf_quant_config.json quantization.exclude_modules

    @property
    def quantized(self) -> bool:
        return self.quant_algo is not None

    @property
    def exclusions(self) -> tuple[str, ...]:
        """The list vLLM uses: config.json's when present, else hf_quant_config.json's."""
        if self.ignore is not None:
            return self.ignore
        return self.exclude_modules or ()


def group_modules(infos: dict[str, TensorInfo]) -> list[StoredModule]:
    """Group stored tensors into modules; a `weight` is NVFP4 when it is uint8 with an fp8 `weight_scale`."""
    by_module: dict[str, dict[str, TensorInfo]] = {}
    for name, info in infos.items():
        module, leaf = split_name(name)
        by_module.setdefault(module, {})[leaf] = info
    modules = []
    for module, leaves in by_module.items():
        weight = leaves.get("weight")
        if weight is None:
            modules.extend(_plain(f"{module}.{leaf}" if module else leaf, info) for leaf, info in leaves.items())
            continue
        modules.append(_weighted(module, weight, leaves))
        modules.extend(_plain(f"{module}.{leaf}", info) for leaf, info in leaves.items() if leaf not in ("weight", *SIDECARS))
    return sorted(modules, key=lambda m: m.name)


def _plain(name: str, info: TensorInfo) -> StoredModule:
    return StoredModule(name, info.dtype.lower(), info.shape, info.shape, (("value", info.name),))


def _weighted(module: str, weight: TensorInfo, leaves: dict[str, TensorInfo]) -> StoredModule:
    roles = [("weight", weight.name)] + [(leaf, leaves[leaf].name) for leaf in SIDECARS if leaf in leaves]
    scale = leaves.get("weight_scale")
    has_sidecar = (scale is not None and scale.dtype == "F8_E4M3") or "weight_scale_2" in leaves
    packed = weight.dtype == "U8" and len(weight.shape) == 2 and has_sidecar  # a lost weight_scale still means packed
    if not packed:
        return StoredModule(module, weight.dtype.lower(), weight.shape, weight.shape, tuple(roles))
    logical = (weight.shape[0], weight.shape[1] * 2)
    return StoredModule(module, "nvfp4", weight.shape, logical, tuple(roles))


def check_packed(module: StoredModule, infos: dict[str, TensorInfo], where: str) -> None:
    """Raise BadInput unless a packed module can be dequantized: scales present, shaped and usable.

    Reads only the 4-byte global scale and the fp8 block scales (small), so it is cheap at plan
    time; dequantizing a NaN, infinite or non-positive scale would write garbage that looks fixed.
    """
    weight = infos[module.tensor("weight")]
    out, logical_in = module.logical_shape
    if logical_in % BLOCK:
        raise BadInput(
            f"{_at(weight, where)}: packed shape {list(weight.shape)} unpacks to {logical_in} input columns, "
            f"not a multiple of the {BLOCK}-element block; {BROKEN_EXPORT}"
        )
    scale = _sidecar(module, "weight_scale", infos, weight, where)
    if scale.dtype != "F8_E4M3" or scale.shape != (out, logical_in // BLOCK):
        raise BadInput(
            f"{_at(scale, where)}: {scale.dtype} {list(scale.shape)} does not fit packed weight {list(weight.shape)} "
            f"(expected F8_E4M3 {[out, logical_in // BLOCK]}); {BROKEN_EXPORT}"
        )
    scale_2 = _sidecar(module, "weight_scale_2", infos, weight, where)
    if scale_2.dtype != "F32" or scale_2.shape not in ((), (1,)):
        raise BadInput(f"{_at(scale_2, where)}: expected a float32 scalar, found {scale_2.dtype} {list(scale_2.shape)}; {BROKEN_EXPORT}")
    problem = global_scale_problem(read_f32_scalar(scale_2.path, scale_2))
    if problem:
        raise BadInput(f"{_at(scale_2, where)}: global scale {problem}, so every dequantized value would be wrong; {BROKEN_EXPORT}")
    stats = block_scale_stats(scale.path, scale)
    if stats.nan or stats.negative:
        raise BadInput(f"{_at(scale, where)}: {stats.nan} NaN and {stats.negative} negative block scales; {BROKEN_EXPORT}")


BROKEN_EXPORT = "the export is broken: re-download it, or re-export from the original model"


def _sidecar(module: StoredModule, role: str, infos: dict[str, TensorInfo], weight: TensorInfo, where: str) -> TensorInfo:
    name = module.tensor(role)
    if name is None:
        raise BadInput(f"{_at(weight, where)}: packed NVFP4 weight without its {role}; {BROKEN_EXPORT}")
    return infos[name]


def _at(info: TensorInfo, where: str) -> str:
    """`file: tensor` for error lines (the shard when known, else the checkpoint folder)."""
    return f"{info.path or where}: {info.name}"


def read_declaration(ckpt: Checkpoint) -> Declaration:
    """Read both config files' claims, validating the keys this format needs.

    A quantization section without a quant_algo, an algo other than NVFP4, or the two files
    naming different algos is refused: repairing on a guess could write a wrong config.
    """
    cfg_path, hf_path = ckpt.root / CONFIG, ckpt.root / HF_QUANT_CONFIG
    quant_cfg = (ckpt.config or {}).get("quantization_config")
    algos: dict[object, object] = {}  # file -> the quant_algo it declares
    ignore = exclude = None
    if quant_cfg is not None:
        if not isinstance(quant_cfg, dict):
            raise BadInput(f"{cfg_path}: quantization_config is not an object; fix the config")
        method = quant_cfg.get("quant_method")
        if method not in (None, "modelopt", "modelopt_fp4"):
            raise BadInput(f"{cfg_path}: quant_method {method!r} is not supported; this tool repairs ModelOpt NVFP4 checkpoints")
        if quant_cfg.get("quant_algo") is not None:
            algos[cfg_path] = quant_cfg["quant_algo"]
        ignore = _name_list(quant_cfg.get("ignore", []), cfg_path, "quantization_config.ignore")
    if ckpt.hf_quant_config is not None:
        section = ckpt.hf_quant_config.get("quantization")
        if not isinstance(section, dict):
            raise BadInput(f"{hf_path}: missing the 'quantization' object; fix or re-download it")
        if section.get("quant_algo") is not None:
            algos[hf_path] = section["quant_algo"]
        exclude = _name_list(section.get("exclude_modules", []), hf_path, "quantization.exclude_modules")
    for path, algo in algos.items():
        if algo != "NVFP4":
            raise BadInput(f"{path}: quant_algo {algo!r} is not supported; this tool repairs NVFP4 checkpoints")
    if not algos and (quant_cfg is not None or ckpt.hf_quant_config is not None):
        path, key = (cfg_path, "quantization_config") if quant_cfg is not None else (hf_path, "quantization")
        raise BadInput(f"{path}: {key} has no quant_algo; add \"quant_algo\": \"NVFP4\" if it is an NVFP4 export, or re-download it")
    return Declaration("NVFP4" if algos else None, ignore, exclude)


def _name_list(value: object, path: object, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise BadInput(f"{path}: {key} must be a list of module names; fix the config")
    return tuple(value)


def with_exclusions(ckpt: Checkpoint, names: list[str], covers, remove: list[str] = ()) -> tuple[dict | None, dict | None]:
    """New (config.json, hf_quant_config.json) contents where both exclusion lists cover `names`.

    `covers(list, name)` tells whether a list already excludes a module (the runtime's matching
    rules); only names a list does not cover are appended to it. Exact entries naming a module
    in `remove` are taken out (it is quantized again).
    """
    config = copy.deepcopy(ckpt.config)
    hf_quant = copy.deepcopy(ckpt.hf_quant_config)
    if config is not None and isinstance(config.get("quantization_config"), dict):
        qc = config["quantization_config"]
        qc["ignore"] = _append([n for n in qc.get("ignore") or [] if n not in remove], names, covers)
    if hf_quant is not None:
        section = hf_quant["quantization"]
        section["exclude_modules"] = _append([n for n in section.get("exclude_modules") or [] if n not in remove], names, covers)
    return config, hf_quant


def exclusion_lists(config: dict | None, hf_quant: dict | None) -> list[list[str]]:
    """The exclusion lists present in (config.json, hf_quant_config.json) contents."""
    lists = []
    if config is not None and isinstance(config.get("quantization_config"), dict):
        lists.append(list(config["quantization_config"].get("ignore") or []))
    if hf_quant is not None:
        lists.append(list(hf_quant["quantization"].get("exclude_modules") or []))
    return lists


def without_quantization(ckpt: Checkpoint) -> dict | None:
    """config.json contents for a plain BF16 checkpoint (no quantization_config)."""
    config = copy.deepcopy(ckpt.config)
    if config is not None:
        config.pop("quantization_config", None)
    return config


def _append(existing: list[str], names: list[str], covers) -> list[str]:
    missing = [n for n in names if not covers(existing, n)]
    return list(existing) + missing
