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
    packed = weight.dtype == "U8" and scale is not None and scale.dtype == "F8_E4M3" and len(weight.shape) == 2
    if not packed:
        return StoredModule(module, weight.dtype.lower(), weight.shape, weight.shape, tuple(roles))
    logical = (weight.shape[0], weight.shape[1] * 2)
    return StoredModule(module, "nvfp4", weight.shape, logical, tuple(roles))


def check_packed(module: StoredModule, infos: dict[str, TensorInfo], where: str) -> None:
    """Raise BadInput unless an NVFP4 module has consistent scales (needed before dequantizing it)."""
    out, logical_in = module.logical_shape
    scale = infos[module.tensor("weight_scale")]
    if scale.shape != (out, logical_in // BLOCK) or logical_in % BLOCK:
        raise BadInput(
            f"{where}: {scale.name}: shape {list(scale.shape)} does not fit packed weight {list(module.stored_shape)} "
            f"(expected {[out, logical_in // BLOCK]}); the export is corrupt, use --original"
        )
    scale_2 = module.tensor("weight_scale_2")
    if scale_2 is None:
        raise BadInput(f"{where}: {module.name}.weight_scale_2 is missing for a packed NVFP4 weight; the export is corrupt, use --original")
    info = infos[scale_2]
    if info.dtype != "F32" or info.shape not in ((), (1,)):
        raise BadInput(f"{where}: {scale_2}: expected a float32 scalar, found {info.dtype} {list(info.shape)}; the export is corrupt")


def read_declaration(ckpt: Checkpoint) -> Declaration:
    """Read both config files' claims, validating the keys this format needs."""
    quant_cfg = (ckpt.config or {}).get("quantization_config")
    algo = None
    ignore = None
    if quant_cfg is not None:
        if not isinstance(quant_cfg, dict):
            raise BadInput(f"{ckpt.root / CONFIG}: quantization_config is not an object; fix the config")
        algo = quant_cfg.get("quant_algo")
        ignore = _name_list(quant_cfg.get("ignore", []), ckpt.root / CONFIG, "quantization_config.ignore")
    exclude = None
    if ckpt.hf_quant_config is not None:
        section = ckpt.hf_quant_config.get("quantization")
        if not isinstance(section, dict):
            raise BadInput(f"{ckpt.root / HF_QUANT_CONFIG}: missing the 'quantization' object; fix or re-download it")
        algo = algo or section.get("quant_algo")
        exclude = _name_list(section.get("exclude_modules", []), ckpt.root / HF_QUANT_CONFIG, "quantization.exclude_modules")
    if algo is not None and algo != "NVFP4":
        raise BadInput(f"{ckpt.root / CONFIG}: quant_algo {algo!r} is not supported; this tool repairs NVFP4 checkpoints")
    return Declaration(algo, ignore, exclude)


def _name_list(value: object, path: object, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise BadInput(f"{path}: {key} must be a list of module names; fix the config")
    return tuple(value)


def with_exclusions(ckpt: Checkpoint, names: list[str]) -> tuple[dict | None, dict | None]:
    """New (config.json, hf_quant_config.json) contents with `names` appended to both exclusion lists."""
    config = copy.deepcopy(ckpt.config)
    hf_quant = copy.deepcopy(ckpt.hf_quant_config)
    if config is not None and isinstance(config.get("quantization_config"), dict):
        qc = config["quantization_config"]
        qc["ignore"] = _append(qc.get("ignore") or [], names)
    if hf_quant is not None:
        section = hf_quant["quantization"]
        section["exclude_modules"] = _append(section.get("exclude_modules") or [], names)
    return config, hf_quant


def without_quantization(ckpt: Checkpoint) -> dict | None:
    """config.json contents for a plain BF16 checkpoint (no quantization_config)."""
    config = copy.deepcopy(ckpt.config)
    if config is not None:
        config.pop("quantization_config", None)
    return config


def _append(existing: list[str], names: list[str]) -> list[str]:
    return list(existing) + [n for n in names if n not in existing]
